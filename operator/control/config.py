"""What a control loop is configured with, and what each cycle reports."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from cadence.scheduler.snapshot import (
    Knobs,
)
from cadence.sim.budgets import Budgets


@dataclass(frozen=True, slots=True)
class LoopConfig:
    knobs: Knobs
    period_s: float = 0.5
    state_timeout_s: float = 2.0
    # Placing pulls a departed trajectory from its source (claim, start, release): a
    # busy host needs longer than a state read. A call that times out may still land;
    # its sample is re-queued under a new attempt and the late copy is fenced off.
    action_timeout_s: float = 15.0
    lost_after_s: float = 10.0
    # A lost worker is asked again after this, then after twice as long, up to the
    # ceiling: a paused host (a long GC pause, a frozen node) rejoins once it answers.
    probe_lost_s: float = 2.0
    max_probe_lost_s: float = 30.0
    max_tool_calls: int = 0
    # Each fresh sample's length under the run's length law; None: the model decides,
    # up to the ledger's max_tokens.
    budgets: Budgets | None = None


@dataclass
class CycleReport:
    cycle_ms: float
    ledger_ms: float  # reading the trainer's ledger
    observe_ms: float  # every worker's state, in parallel
    plan_ms: float
    apply_ms: float  # every action's call, in phases
    # Reconciling the ledger with the workers and building the snapshot, between the
    # observation and the plan.
    reconcile_ms: float
    # CPU time of the loop's thread over the cycle: its own work, without the waiting
    # (on a machine that also runs the workers, most of a cycle's wall time is theirs).
    cpu_ms: float
    actions: Counter[str]
    errors: int
    requeued: int
    lost: list[str]
    # Python's full garbage collection run in the idle time after this cycle (0: none
    # was due); outside `cycle_ms` (`idle_gc.py`).
    idle_gc_ms: float = 0.0
