"""AReaL-like: partial rollout with weight-switch resumption.

Source: the AReaL paper (arXiv 2505.24298) and inclusionAI/AReaL. Samples are dispatched round
robin, each its own request, its server fixed. After each training step every server is
paused: running and waiting requests are aborted and the KV cache cleared, the new
weights are loaded, and each aborted request is resubmitted to the same server as
prompt + tokens so far, re-prefilled under the new weights. A trajectory can therefore
span versions (each token tagged with its version): this is the one policy that breaks
"a sample is generated on one version", by design. A new rollout starts while
(eta + v + 1) x B exceeds the groups started, and each training batch takes the B oldest
completed groups, not batch u in admission order (the simulator's trainer follows the
policy's `trainer_takes`).

`max_concurrent` is AReaL's cap on rollouts in flight (its value is a deployment choice:
sweep it); None leaves only the engines' own batch limit and KV queue. Simplification:
pausing costs what the simulator charges an advance plus the re-prefills.
"""

from __future__ import annotations

from dataclasses import dataclass

from cadence.scheduler.actions import Action, Admit, Advance, Evict, EvictReason, Place
from cadence.scheduler.admission import groups_to_admit
from cadence.scheduler.baselines.dispatch import least_assigned
from cadence.scheduler.baselines.sync import DispatchState
from cadence.scheduler.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class ArealPolicy:
    name: str = "areal"
    max_concurrent: int | None = None
    spans_versions: bool = True
    trainer_takes: str = "oldest_complete"

    def initial_state(self) -> DispatchState:
        return DispatchState()

    def staleness_bound(self, eta: int) -> int:
        return eta

    def plan(self, snapshot: Snapshot, state: DispatchState) -> tuple[list[Action], DispatchState]:
        out: list[Action] = []
        admit = groups_to_admit(snapshot)
        if admit:
            out.append(Admit(admit))
        newest = snapshot.newest_version
        workers = {}
        for w in snapshot.workers:
            if w.draining:
                continue
            if w.version is None or w.version < newest:
                # Pause: abort everything, load the new weights, resubmit in place.
                for r in w.residents:
                    out.append(Evict(r.id, w.id, r.context, EvictReason.INTERRUPT))
                out.append(Advance(w.id, newest))
                for r in w.residents:
                    out.append(Place(r.id, w.id, newest, r.context))
            else:
                workers[w.id] = w
        # Tool-call returns go back to their server, re-tagged with its current version.
        for p in snapshot.pending:
            home = workers.get(p.parked_on or "")
            if p.placeable and home is not None and home.version is not None:
                out.append(Place(p.id, home.id, home.version, p.context))
        ready = list(workers.values())
        fresh = snapshot.fresh
        if self.max_concurrent is not None:
            running = sum(len(w.residents) for w in snapshot.workers) + len(snapshot.pending)
            fresh = fresh[: max(0, self.max_concurrent - running)]
        assigned = least_assigned(fresh, ready, state.assigned, out)
        return out, DispatchState(assigned)
