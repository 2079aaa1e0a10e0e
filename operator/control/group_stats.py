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

A pure function over the snapshot and the plan, as the scheduler is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cadence.scheduler.actions import Action, Evict, Place
from cadence.scheduler.snapshot import Knobs, Snapshot


@dataclass(frozen=True, slots=True)
class GroupShape:
    """A RolloutGroup as demand sees it: its name, affinity and one worker's KV tokens."""

    name: str
    affinity: int
    capacity: int


@dataclass(frozen=True, slots=True)
class GroupStats:
    workers: int = 0
    versions: tuple[int, ...] = ()
    mean_context: float = 0.0  # over its workers' residents, tokens
    headroom_tokens: int = 0  # free KV tokens per worker, on average
    pending_trajectories: int = 0
    pending_tokens: int = 0


def waiting(snapshot: Snapshot, actions: Sequence[Action]) -> dict[str, int]:
    """Trajectory id -> context of what waits for a worker after `actions` are applied."""
    placed = {a.trajectory for a in actions if isinstance(a, Place)}
    left = {p.id: p.context for p in snapshot.pending if p.placeable and p.id not in placed}
    for a in actions:
        if isinstance(a, Evict) and a.trajectory not in placed:
            left[a.trajectory] = a.context
    return left


def wanted_group(context: int, groups: Sequence[GroupShape], knobs: Knobs) -> str | None:
    """The highest-affinity group (then the larger, then by name) that could hold a
    trajectory of `context` tokens above the floor and one decode reserve."""
    fits = [g for g in groups if g.capacity - context >= knobs.h_min + knobs.delta]
    if not fits:
        return None
    return min(fits, key=lambda g: (-g.affinity, -g.capacity, g.name)).name


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
    demand = {g.name: [0, 0] for g in groups}
    for context in waiting(snapshot, actions).values():
        name = wanted_group(context, groups, snapshot.knobs)
        if name is not None:
            demand[name][0] += 1
            demand[name][1] += context
    out = {}
    for g in groups:
        ws = [snapshot.workers[i] for i in members[g.name]]
        contexts = [r.context for w in ws for r in w.residents]
        out[g.name] = GroupStats(
            workers=len(ws),
            versions=tuple(sorted({w.version for w in ws if w.version is not None})),
            mean_context=round(sum(contexts) / len(contexts), 1) if contexts else 0.0,
            headroom_tokens=sum(w.headroom for w in ws) // len(ws) if ws else 0,
            pending_trajectories=demand[g.name][0],
            pending_tokens=demand[g.name][1],
        )
    return out
