"""What each RolloutGroup holds and what waits for it, from one control cycle.

The operator writes these into each RolloutGroup's status (`kubectl get rolloutgroups`
shows PENDING) and exports the waiting demand as Prometheus gauges, which an HPA or KEDA
scales a group on through its `/scale`.

Waiting demand is what the cycle's plan left in P_v: parked trajectories it did not
place, and residents it departed and did not place elsewhere. Each is counted for the
group it is waiting for: the highest-affinity group whose workers could hold it above
`h_min + delta`, where concentration would send it if that group had room, so adding a
worker of that group is what would serve it. Fresh samples are not demand: admission
paces them by the staleness bound, and they fill whatever headroom exists. Parked
trajectories waiting on their environment are not either: no worker can take them.

A pure function over the snapshot and the plan, as the scheduler is; the demand's
attribution is the autoscaler's (`scheduler/autoscale.py`), which scales by it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cadence.scheduler.actions import Action
from cadence.scheduler.autoscale import GroupShape, demand
from cadence.scheduler.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class GroupStats:
    workers: int = 0
    versions: tuple[int, ...] = ()
    mean_context: float = 0.0  # over its workers' residents, tokens
    headroom_tokens: int = 0  # free KV tokens per worker, on average
    pending_trajectories: int = 0
    pending_tokens: int = 0


def group_stats(
    snapshot: Snapshot,
    actions: Sequence[Action],
    groups: Sequence[GroupShape],
    group_of: Mapping[str, str],
) -> dict[str, GroupStats]:
    """Per group: its workers' versions, mean resident context and headroom, and the
    demand waiting for it. `group_of` maps a worker id to its group's name."""
    members: dict[str, list[int]] = {g.name: [] for g in groups}
    for i, w in enumerate(snapshot.workers):
        if group_of.get(w.id) in members:
            members[group_of[w.id]].append(i)
    waits = demand(snapshot, actions, groups)
    out = {}
    for g in groups:
        ws = [snapshot.workers[i] for i in members[g.name]]
        contexts = [r.context for w in ws for r in w.residents]
        out[g.name] = GroupStats(
            workers=len(ws),
            versions=tuple(sorted({w.version for w in ws if w.version is not None})),
            mean_context=round(sum(contexts) / len(contexts), 1) if contexts else 0.0,
            headroom_tokens=sum(w.headroom for w in ws) // len(ws) if ws else 0,
            pending_trajectories=waits[g.name][0],
            pending_tokens=waits[g.name][1],
        )
    return out
