"""The figures of a `cadence run`, over the whole run.

The control loop keeps only its last 1,000 cycle reports (`ControlLoop.reports`); a run's
totals (cycles, re-queued samples, actions) come from its whole-run counters instead, and
its cycle-time percentiles from a fixed-size uniform sample of every cycle (`Reservoir`),
so an hour's run is summed whole and summarised in bounded memory. Samples lost and
accepted twice come from the trainer's ledger itself, read after the run.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, NamedTuple, TypeVar

from cadence.common.stats import percentile
from cadence.operator.control.config import CycleReport
from cadence.operator.control.events import Event, events_of
from cadence.operator.control.loop import ControlLoop
from cadence.operator.local.mechanism import (
    MAX_EVENTS,
    Sample,
    action_counts,
    roles,
    tail_figures,
)
from cadence.operator.local.supervise import PoolWorker
from cadence.trainer.api import RunStats
from cadence.worker.api import MoveCounts

T = TypeVar("T")

SAMPLE_CYCLES = 10_000  # cycles the percentiles are taken over, at most


class Reservoir(Generic[T]):
    """A uniform random sample of at most `size` of every item added (Vitter's algorithm
    R), seeded, so the same run of items gives the same sample."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size = size
        self.items: list[T] = []
        self.seen = 0
        self._rng = random.Random(seed)

    def add(self, item: T) -> None:
        self.seen += 1
        if len(self.items) < self.size:
            self.items.append(item)
            return
        j = self._rng.randrange(self.seen)
        if j < self.size:
            self.items[j] = item


class Timings(NamedTuple):
    """One cycle's times, in milliseconds."""

    cycle_ms: float
    ledger_ms: float
    observe_ms: float
    plan_ms: float
    apply_ms: float


@dataclass
class RunLoop(ControlLoop):
    """The control loop of a run, keeping a sample of every cycle's timings."""

    sample: Reservoir[Timings] = field(default_factory=lambda: Reservoir(SAMPLE_CYCLES))
    origin: float = 0.0  # the loop clock at the run's start
    events: list[Event] = field(default_factory=list)  # the first MAX_EVENTS
    event_counts: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, detail)

    async def cycle(self) -> CycleReport:
        r = await super().cycle()
        self.sample.add(Timings(r.cycle_ms, r.ledger_ms, r.observe_ms, r.plan_ms, r.apply_ms))
        if self.last_plan is not None:
            snapshot = self.last_plan[0]
            events = events_of(snapshot, self.last_applied, at=self.clock() - self.origin)
            self.event_counts.update((e.kind, e.detail) for e in events)
            self.events.extend(events[: max(0, MAX_EVENTS - len(self.events))])
        return r


@dataclass(frozen=True, slots=True)
class LedgerFigures:
    """What the ledger holds at the end of a run."""

    admitted: int
    ended: int  # delivered or consumed
    failed: int
    accepted_twice: int
    max_lag: int | None = None  # the most versions a consumed sample trailed its batch


def read_ledger(path: Path, group_size: int, batch_groups: int) -> LedgerFigures:
    from cadence.trainer.ledger import Ledger  # noqa: PLC0415

    ledger = Ledger(path, group_size=group_size, batch_groups=batch_groups)
    try:
        counts = ledger.counts()
        return LedgerFigures(
            admitted=sum(n for state, n in counts.items() if state != "failed"),
            ended=counts.get("delivered", 0) + counts.get("consumed", 0),
            failed=counts.get("failed", 0),
            accepted_twice=ledger.accepted_twice(),
            max_lag=max(ledger.lag_counts(), default=0),
        )
    finally:
        ledger.close()


def measures(
    stats: RunStats,
    loop: RunLoop,
    workers: list[PoolWorker],
    wall: float,
    policy: str,
    *,
    ledger: LedgerFigures | None = None,
    timeline: Sequence[Sample] = (),
) -> dict[str, object]:
    """The run's measures; the sample counts from `ledger` when given, else from `stats`
    (the trainer's own answer from the same ledger)."""
    if ledger is None:
        counts = stats.counts
        ledger = LedgerFigures(
            admitted=sum(n for state, n in counts.items() if state != "failed"),
            ended=counts.get("delivered", 0) + counts.get("consumed", 0),
            failed=counts.get("failed", 0),
            accepted_twice=stats.accepted_twice,
        )
    dollars = sum(w.price_per_hour for w in workers) * wall / 3600
    tokens = stats.tokens_delivered
    totals = loop.totals
    sample = loop.sample.items
    cycles = [r.cycle_ms for r in sample]
    advances = loop.advance_seconds
    return {
        "policy": policy,
        "workers": len(workers),
        "wall_seconds": round(wall, 1),
        "throughput_tok_s": round(tokens / wall, 1) if wall > 0 else 0.0,
        "latency_p50_s": round(stats.latency_p50_s, 3),
        "latency_p95_s": round(stats.latency_p95_s, 3),
        "tokens_per_dollar": round(tokens / dollars, 1) if dollars > 0 else None,
        "samples_admitted": ledger.admitted,
        "samples_delivered": ledger.ended,
        "samples_lost": ledger.admitted - ledger.ended,
        "samples_duplicated": ledger.accepted_twice,
        "samples_failed": ledger.failed,
        "requeued": totals["requeued"],
        "actions": {k: totals[k] for k in ("evict", "place", "advance", "admit")},
        **action_counts(loop.event_counts),
        **_migrations(loop.moves),
        **tail_figures(timeline),
        "roles_s": roles(timeline),
        "staleness_bound": loop.policy.staleness_bound(loop.config.knobs.eta),
        "max_version_lag": ledger.max_lag,
        "deliveries_stale": stats.arrivals.get("stale", 0),
        "cycle_ms_p50": round(statistics.median(cycles), 2) if cycles else 0.0,
        "cycle_ms_p95": round(percentile(cycles, 0.95), 2),
        "cycle_ledger_ms_p95": round(percentile([r.ledger_ms for r in sample], 0.95), 2),
        "cycle_observe_ms_p95": round(percentile([r.observe_ms for r in sample], 0.95), 2),
        "cycle_plan_ms_p95": round(percentile([r.plan_ms for r in sample], 0.95), 2),
        "cycle_apply_ms_p95": round(percentile([r.apply_ms for r in sample], 0.95), 2),
        "cycles": totals["cycles"],
        "advance_s_mean": round(statistics.mean(advances), 3) if advances else None,
        "reward_by_version": {
            str(v): round(stats.reward_by_version[v], 4) for v in sorted(stats.reward_by_version)
        },
    }


def _migrations(moves: MoveCounts) -> dict[str, int]:
    """Moves by kind, named as the simulator names them."""
    return {
        "migrations_kv": moves.kv,
        "migrations_reprefill": moves.reprefill,
        "migrations_kv_fallbacks": moves.kv_fallbacks,
        "migrated_kv_bytes": moves.kv_bytes,
        "reprefill_tokens": moves.reprefill_tokens,
    }
