"""DORA-like: each instance group serves one version; groups are rebalanced across
versions by demand.

Source: DORA (Meituan, arXiv 2604.26256); the paper's DORA* is a simplified
version, and the paper excludes it from heterogeneous pools because its reallocation
model assumes identical hardware. Here each worker is one instance group. New samples go
to the newest version; older versions only take work into idle slots. After each training
step and periodically, each live version v gets round(W x R_v / sum R) workers, R_v its
active + pending requests (the newest's fresh work included); a worker moving from an
old version to the newest sends its requests to other workers of their version with
their KV (a trajectory never changes version) and loads the new weights. At most K = eta
+ 1 versions are live: admission follows the same eta bound as Cadence.

Unknowns, left as parameters to sweep: the rebalance period, and the KV-pressure trigger
(not modelled: the period and the training steps trigger rebalancing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cadence.scheduler.actions import Action, Admit, Advance, Evict, EvictReason, Place
from cadence.scheduler.admission import groups_to_admit, may_start
from cadence.scheduler.moves import MoveRule
from cadence.scheduler.snapshot import Snapshot, WorkerView


@dataclass(frozen=True, slots=True)
class DoraState:
    last_rebalance: float = float("-inf")
    last_newest: int = -1


class _Load:
    """Workers of one version with what this plan has added to each."""

    def __init__(self, workers: Sequence[WorkerView]) -> None:
        self.used = {w.id: w.used for w in workers}
        self.count = {w.id: len(w.residents) for w in workers}
        self.workers = list(workers)
        # Loads only grow within a plan: once a context fits nowhere, no longer one will.
        self.fits_below = float("inf")

    def place(
        self,
        trajectory: str,
        context: int,
        out: list[Action],
        limit: float,
        allowed: Callable[[WorkerView], bool] | None = None,
    ) -> bool:
        """Onto the least-loaded worker with room (KV below `limit` of its capacity) that
        `allowed` accepts (the migration knob's kv restriction)."""
        if context >= self.fits_below:
            return False
        best: WorkerView | None = None
        for w in self.workers:
            if self.used[w.id] + context > limit * w.capacity:
                continue
            if allowed is not None and not allowed(w):
                continue
            if best is None or (self.count[w.id], w.id) < (self.count[best.id], best.id):
                best = w
        if best is None or best.version is None:
            if allowed is None:
                self.fits_below = min(self.fits_below, context)
            return False
        out.append(Place(trajectory, best.id, best.version, context))
        self.used[best.id] += context
        self.count[best.id] += 1
        return True


@dataclass(frozen=True, slots=True)
class DoraPolicy:
    name: str = "dora"
    rebalance_period_s: float = 30.0
    fill: float = 0.95  # KV share a worker may be filled to by dispatch

    def initial_state(self) -> DoraState:
        return DoraState()

    def staleness_bound(self, eta: int) -> int:
        return eta

    def plan(self, snapshot: Snapshot, state: DoraState) -> tuple[list[Action], DoraState]:
        out: list[Action] = []
        admit = groups_to_admit(snapshot)
        if admit:
            out.append(Admit(admit))
        newest = snapshot.newest_version
        live = [w for w in snapshot.workers if not w.draining]
        for w in live:
            if w.version is None:
                out.append(Advance(w.id, newest))
        by_version: dict[int, list[WorkerView]] = {}
        for w in live:
            if w.version is not None:
                by_version.setdefault(w.version, []).append(w)

        moved: set[str] = set()
        last = state.last_rebalance
        due = snapshot.now - last >= self.rebalance_period_s
        if by_version and (due or newest != state.last_newest):
            moved = self._rebalance(snapshot, by_version, out)
            last = snapshot.now
        loads = {v: _Load([w for w in ws if w.id not in moved]) for v, ws in by_version.items()}
        rule = MoveRule(snapshot)
        for p in snapshot.pending:
            if p.placeable and p.version in loads:
                group = rule.restriction(p)
                allowed = None if group is None else _in_group(group, p.parked_on)
                loads[p.version].place(p.id, p.context, out, self.fill, allowed)
        # New work to the newest version first; older versions only into idle slots.
        versions = sorted(loads, reverse=True)
        b = snapshot.admission.batch_size
        for f in snapshot.fresh:
            for v in versions:
                if may_start(f.group // b, v, snapshot.knobs.eta) and loads[v].place(
                    f.id, f.prompt_tokens, out, self.fill
                ):
                    break
        return out, DoraState(last, newest)

    def _rebalance(
        self, snapshot: Snapshot, by_version: dict[int, list[WorkerView]], out: list[Action]
    ) -> set[str]:
        """Move surplus workers of older versions to the newest, by demand share."""
        newest = snapshot.newest_version
        demand = {v: sum(len(w.residents) for w in ws) for v, ws in by_version.items()}
        for p in snapshot.pending:
            demand[p.version] = demand.get(p.version, 0) + 1
        demand[newest] = demand.get(newest, 0) + len(snapshot.fresh)
        total_demand = sum(demand.values())
        workers = sum(len(ws) for ws in by_version.values())
        if total_demand == 0:
            return set()
        moved: set[str] = set()
        for v in sorted(by_version):
            if v >= newest:
                continue
            ws = sorted(by_version[v], key=lambda w: (w.used, w.id))
            keep = max(1 if demand.get(v, 0) else 0, round(workers * demand[v] / total_demand))
            surplus = ws[: max(0, len(ws) - keep)]
            stay = [w for w in ws if w not in surplus]
            load = _Load(stay)
            kv_only = snapshot.knobs.migration == "kv"
            for w in surplus:
                group = w.transfer_group if kv_only else None
                allowed = None if group is None else _in_group(group, None)
                for r in w.residents:
                    out.append(Evict(r.id, w.id, r.context, EvictReason.REPACK))
                    load.place(r.id, r.context, out, 1.0, allowed)
                out.append(Advance(w.id, newest))
                moved.add(w.id)
        return moved


def _in_group(group: str, home: str | None) -> Callable[[WorkerView], bool]:
    """Under migration kv: workers that can pull from `group`, and `home` itself."""
    return lambda w: w.transfer_group == group or w.id == home
