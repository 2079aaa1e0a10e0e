"""What a simulated run is made of while it runs: each trajectory and each modelled
worker, and what the run reports when it ends (the result, its per-period samples and a
trace of one trajectory's life), with the figures computed from finished trajectories."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from cadence.common.physics import Deployment
from cadence.common.stats import percentile
from cadence.scheduler.cost import StepCost
from cadence.sim.engine import ModelledEngine
from cadence.sim.scenario import step_cost
from cadence.sim.workload import Sample

State = Literal["fresh", "pending", "env", "running", "done"]


# Simulated seconds with nothing decoded, trained, loading or waiting on an environment
# after which a run is stalled: far above any real pause (a weight load takes seconds).
@dataclass
class Trajectory:
    sample: Sample
    state: State = "fresh"
    version: int | None = None
    worker: str | None = None  # where it is resident
    parked_on: str | None = None  # where its state waits after a departure
    context: int = 0
    generated: int = 0
    observed: int = 0
    calls_made: int = 0
    first_step: float | None = None
    done_at: float | None = None
    pending_since: float = 0.0
    env_until: float = 0.0
    moves: int = 0
    waited_s: float = 0.0  # pending and placeable, yet not placed (environment time excluded)
    evicted: bool = False  # its last departure was an eviction (its next placement a move)
    versions_spanned: int = 0  # AReaL-like only: weight switches it decoded across
    start_version: int | None = None  # the version it started on (its staleness)

    def next_stop(self) -> int:
        """Tokens to decode before it next stops: its next tool call, or its end."""
        calls = self.sample.tool_calls
        target = calls[self.calls_made] if self.calls_made < len(calls) else None
        return (target if target is not None else self.sample.response_tokens) - self.generated


@dataclass
class Worker:
    id: str
    group: str
    affinity: int
    deployment: Deployment
    price_per_hour: float | None
    engine: ModelledEngine
    version: int | None = None
    cost: StepCost | None = field(default=None, init=False)
    # Workers that can pull each other's KV: same model (one per scenario), accelerator
    # type and tensor-parallel degree; None where the scenario has no KV link.
    transfer_group: str | None = None

    accelerator: str = field(default="", init=False)  # the deployment's type name

    def __post_init__(self) -> None:
        self.cost = step_cost(self.deployment)
        self.accelerator = self.deployment.accelerator.name


@dataclass(frozen=True, slots=True)
class PeriodSample:
    """One control period as the plots see it."""

    time: float
    tokens: int  # decoded in the period
    newest: int
    mean_context: dict[str, float]  # per accelerator type: resident KV over residents


@dataclass(frozen=True, slots=True)
class TracePoint:
    """The traced trajectory at the end of one control period (Figure 14)."""

    time: float
    resident: bool
    kv_share: float  # of its worker's resident KV, 0 while it is not resident
    generated: int


@dataclass
class Result:
    """One policy's run. `tokens_per_dollar` is None when some worker has no price;
    `staleness_bound` is the policy's bound at the scenario's eta, `max_version_lag` the
    most versions any consumed sample's batch ran ahead of the version it started on;
    `tool_departures` counts trajectories leaving a worker for a tool call (each comes
    back as a placement, a move at a turn boundary). `migrations` counts the policy's own
    moves (placements after an eviction), by kind: `migrations_kv` pulled their KV
    (`migrated_kv_bytes` in all) and `migrations_reprefill` recomputed it on the
    destination (`reprefilled_tokens` of context in all, `reprefilled_kv_bytes` the KV
    that rebuilt); a placement back on the worker it left re-prefills there."""

    policy: str
    throughput_tok_s: float
    latency_p50_s: float
    latency_p95_s: float
    tokens_per_dollar: float | None
    trajectories: int
    migrations: int
    migrations_kv: int
    migrations_reprefill: int
    migrated_kv_bytes: float
    reprefilled_tokens: int
    reprefilled_kv_bytes: float
    preemptions: int
    simulated_seconds: float
    generated_tokens: int
    staleness_bound: int = 0
    max_version_lag: int = 0
    tool_departures: int = 0
    extras: dict[str, Any] = field(default_factory=dict)
    timeline: list[PeriodSample] = field(default_factory=list, repr=False)
    trace: list[TracePoint] = field(default_factory=list, repr=False)


def slowest_tenth_share(done: Sequence[Trajectory], prompts_per_batch: int) -> float:
    """The share of a batch's rollout time (first step to last completion) spent after
    90% of its samples completed, averaged over batches: the workload's long tail as the
    pool actually served it (the published target is about one half)."""
    ends: dict[int, list[float]] = {}
    starts: dict[int, float] = {}
    for t in done:
        if t.done_at is None or t.first_step is None:
            continue
        u = t.sample.group // prompts_per_batch
        ends.setdefault(u, []).append(t.done_at)
        starts[u] = min(starts.get(u, t.first_step), t.first_step)
    shares = []
    for u, times in ends.items():
        times.sort()
        end, tenth = times[-1], times[math.ceil(0.9 * len(times)) - 1]
        if end > starts[u]:
            shares.append((end - tenth) / (end - starts[u]))
    return statistics.fmean(shares) if shares else 0.0


def tail_anatomy(done: Sequence[Trajectory], prompts_per_batch: int) -> dict[str, Any]:
    """Where the latency tail comes from: P95 per batch (the first batches start on an
    empty pool), and the share of their latency the trajectories at or above the overall
    P95 spent waiting for a placement."""
    latency = {t.sample.id: t.done_at - t.first_step for t in done if t.done_at and t.first_step}
    by_batch: dict[int, list[float]] = {}
    for t in done:
        if t.sample.id in latency:
            by_batch.setdefault(t.sample.group // prompts_per_batch, []).append(
                latency[t.sample.id]
            )
    p95 = percentile(list(latency.values()), 0.95) if latency else 0.0
    tail = [t for t in done if latency.get(t.sample.id, -1.0) >= p95 > 0]
    return {
        "latency_p95_by_batch_s": [
            round(percentile(by_batch[u], 0.95), 1) for u in sorted(by_batch)
        ],
        "tail_waiting_share": (
            statistics.fmean(t.waited_s / latency[t.sample.id] for t in tail) if tail else 0.0
        ),
    }
