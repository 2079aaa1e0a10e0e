"""Sync and One-off: verl's synchronous loop and its one-step-off-policy variant.

Source: verl's trainer loops. Each step takes B prompts x n samples and sends each sample to
the server with the fewest requests assigned so far; multi-turn requests stick to their
server; nothing is interrupted or migrated.

- Sync: the next batch starts only once the whole pool is idle and the trainer has
  published the weights trained on the last one (staleness 0).
- One-off: exactly one batch in flight: batch k+1 starts as soon as batch k's rollout
  ends, under the weights trained through batch k-1, while the trainer trains on batch k
  (staleness 1). Weights change only while the pool is idle.

Simplification: weight pushes cost the time the simulator charges any advance; verl's
NCCL broadcast (under 300 ms reported) is not modelled apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

from cadence.scheduler.actions import Action, Admit, Advance
from cadence.scheduler.baselines.dispatch import least_assigned, sticky_returns
from cadence.scheduler.snapshot import Snapshot


def _empty() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class DispatchState:
    """Requests assigned to each worker so far (verl's least-loaded counter)."""

    assigned: Mapping[str, int] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class VerlPolicy:
    """`staleness` 0 is Sync, 1 is One-off."""

    staleness: int = 0
    name: str = "sync"

    def initial_state(self) -> DispatchState:
        return DispatchState()

    def staleness_bound(self, eta: int) -> int:
        return self.staleness

    def plan(self, snapshot: Snapshot, state: DispatchState) -> tuple[list[Action], DispatchState]:
        out: list[Action] = []
        idle = (
            not snapshot.pending
            and not snapshot.fresh
            and all(not w.residents for w in snapshot.workers)
        )
        b = snapshot.admission.batch_size
        adm = snapshot.admission
        if idle:
            # Weights change only while the pool is idle: every worker takes the newest.
            for w in snapshot.workers:
                if not w.draining and (w.version is None or w.version < snapshot.newest_version):
                    out.append(Advance(w.id, snapshot.newest_version))
            next_batch = adm.groups_admitted // b
            if (
                adm.groups_admitted < adm.total_groups
                and next_batch <= snapshot.newest_version + self.staleness
            ):
                out.append(Admit(min(b, adm.total_groups - adm.groups_admitted)))
            return out, state
        workers = {w.id: w for w in snapshot.workers}
        sticky_returns(snapshot.pending, workers, out)
        ready = [w for w in snapshot.workers if not w.draining and w.version is not None]
        fresh = [
            f
            for f in snapshot.fresh
            if ready and f.group // b <= max(w.version or 0 for w in ready) + self.staleness
        ]
        eligible = [
            w
            for w in ready
            if fresh and w.version is not None and w.version >= fresh[0].group // b - self.staleness
        ]
        assigned = least_assigned(fresh, eligible, state.assigned, out)
        return out, DispatchState(assigned)


sync = partial(VerlPolicy, staleness=0, name="sync")
one_off = partial(VerlPolicy, staleness=1, name="one-off")
