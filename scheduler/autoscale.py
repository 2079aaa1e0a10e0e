"""The RL-aware autoscaler: how many workers each group of a pool should have now.

Serving autoscalers scale a queue. An RL rollout pool is different in four ways this
module uses:

- a batch is a fixed amount of work, and fresh work enters only as fast as the
  staleness bound lets it (`admission_room`): when the bound holds fresh work back, more
  throughput workers cannot help, however long the queue of the version's tail;
- the tail decides when a version can advance: trajectories that wait for the
  highest-affinity workers (the concentration's demand, `pending_tokens`) are what one
  more fast worker shortens;
- once the short work of the newest version has run out, the pool is in its tail
  phase: workers left with nothing to decode are paid for nothing, and are let go;
- each type has a measured decode rate and a price, so it is known which type buys
  throughput per dollar and which buys a shorter tail.

`decide` is a pure function of the pool's signals, the spec and its own state (the
recommendations of the last few minutes, for hysteresis), like the scheduler; the
operator applies its decisions through each RolloutGroup's `/scale`, and the simulator
resizes its pool by them, so both run the same rule. It never lets the pool cost more
than the budget at any instant: it counts a group at the larger of its workers now and
its new target (workers being let go still cost until they are gone), so a scale-out
that only a scale-in pays for waits until that scale-in is done.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from cadence.scheduler.actions import Action, Evict, Place
from cadence.scheduler.snapshot import Knobs, Snapshot

Objective = Literal["throughput_per_dollar", "tail_latency"]


@dataclass(frozen=True, slots=True)
class GroupShape:
    """A group of a pool as demand sees it: its name, affinity and one worker's KV."""

    name: str
    affinity: int
    capacity: int


@dataclass(frozen=True, slots=True)
class GroupSignal:
    """One group now. `workers` are those that exist (starting, serving or draining);
    `decode_tok_s` is what the group decoded per second over the last period."""

    name: str
    affinity: int
    capacity: int  # one worker's KV tokens
    worker_price: float  # per hour
    workers: int
    replicas: int  # the group's target as last set
    min_replicas: int
    max_replicas: int
    used_tokens: int = 0  # KV in use over its workers
    residents: int = 0
    decode_tok_s: float = 0.0
    pending_tokens: int = 0  # demand that waits for this group (concentration's)
    pending_trajectories: int = 0


@dataclass(frozen=True, slots=True)
class PoolSignal:
    groups: tuple[GroupSignal, ...]
    fresh_waiting: int  # admitted fresh samples no worker took
    admission_room: int  # prompt groups the staleness bound still admits
    now: float


@dataclass(frozen=True, slots=True)
class AutoscaleSpec:
    budget_per_hour: float
    objective: Objective = "throughput_per_dollar"
    period_s: float = 30.0
    scale_up_stabilization_s: float = 60.0
    scale_down_stabilization_s: float = 300.0
    max_step: int = 4  # workers one decision adds to or removes from a group
    target_utilization: float = 0.75  # of the pool's KV, by its work
    # How long the pool remembers the most KV its work needed: a batch is a fixed amount
    # of work, and the next one arrives when the version advances, so a tail phase or
    # an update is not a reason to let go of what the next batch will need.
    demand_memory_s: float = 900.0


@dataclass(frozen=True, slots=True)
class Decision:
    """A group's target and why; `changed` when it differs from the group's replicas."""

    group: str
    replicas: int
    reason: str
    changed: bool = True


@dataclass(frozen=True, slots=True)
class AutoscaleState:
    # Per group: (time, recommended replicas), the last scale_down_stabilization_s.
    history: Mapping[str, tuple[tuple[float, int], ...]] = field(default_factory=dict)
    started: float | None = None  # the first decision's time: what came before is unknown
    # Each group's decode rate per worker when last measured: a group scaled to zero
    # keeps what it was worth.
    rates: Mapping[str, float] = field(default_factory=dict)
    # (time, KV tokens the pool's work needed), the last `demand_memory_s`.
    needs: tuple[tuple[float, float], ...] = ()


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


def demand(
    snapshot: Snapshot, actions: Sequence[Action], groups: Sequence[GroupShape]
) -> dict[str, tuple[int, int]]:
    """Per group: (trajectories, tokens) of the demand that waits for it."""
    out = {g.name: (0, 0) for g in groups}
    for context in waiting(snapshot, actions).values():
        name = wanted_group(context, groups, snapshot.knobs)
        if name is not None:
            n, tokens = out[name]
            out[name] = (n + 1, tokens + context)
    return out


def fresh_waiting(snapshot: Snapshot, actions: Sequence[Action]) -> int:
    """Fresh samples admitted that the plan placed nowhere."""
    placed = {a.trajectory for a in actions if isinstance(a, Place)}
    return sum(1 for f in snapshot.fresh if f.id not in placed)


def admission_room(snapshot: Snapshot) -> int:
    """Prompt groups the staleness bound still admits: the trainer admits up to
    (newest + eta + 1) x B groups, and no more than the run has."""
    a = snapshot.admission
    limit = min(a.total_groups, (snapshot.newest_version + snapshot.knobs.eta + 1) * a.batch_size)
    return max(0, limit - a.groups_admitted)


def decide(
    signal: PoolSignal, spec: AutoscaleSpec, state: AutoscaleState
) -> tuple[list[Decision], AutoscaleState]:
    """Each group's target now and why, in the order of `signal.groups`."""
    rates = dict(state.rates)
    for g in signal.groups:
        if g.workers and g.decode_tok_s > 0:
            rates[g.name] = g.decode_tok_s / g.workers
    raw, need = _recommend(signal, spec, rates, state.needs)
    needs = tuple(
        n for n in (*state.needs, (signal.now, need)) if n[0] > signal.now - spec.demand_memory_s
    )
    history = dict(state.history)
    started = signal.now if state.started is None else state.started
    watched = signal.now - started
    target: dict[str, tuple[int, str]] = {}
    for g in signal.groups:
        want, why = raw[g.name]
        seen = (*history.get(g.name, ()), (signal.now, want))
        seen = tuple(p for p in seen if p[0] >= signal.now - spec.scale_down_stabilization_s)
        history[g.name] = seen
        target[g.name] = _stabilised(g, (want, why), seen, (signal.now, watched), spec)
    target = _within_budget(signal.groups, target, spec.budget_per_hour)
    out = [
        Decision(g.name, target[g.name][0], target[g.name][1], target[g.name][0] != g.replicas)
        for g in signal.groups
    ]
    return out, replace(state, history=history, started=started, rates=rates, needs=needs)


def _recommend(
    signal: PoolSignal,
    spec: AutoscaleSpec,
    rates: Mapping[str, float],
    needs: Sequence[tuple[float, float]],
) -> tuple[dict[str, tuple[int, str]], float]:
    """What each group would have, before hysteresis and the budget; and the KV the
    pool's work needs now.

    KV is what an RL pool runs short of: the work a pool holds is its residents' KV and
    the admitted fresh samples no worker took (each about as large as a resident). The pool
    aims at `target_utilization` of its KV: above it by a margin, the group that buys
    the most (tok/$, or tok/s per worker for tail latency) grows by the KV missing;
    below it by a wider one, with no fresh work waiting, the group that buys the least
    lets workers go, keeping what the most work of the last `demand_memory_s` needed.
    Demand waiting for one group grows that group whatever the pool's total: it is the
    tail, and only that group's workers hold it."""
    out = {g.name: (g.replicas, "steady") for g in signal.groups}
    capacity = sum(g.workers * g.capacity for g in signal.groups)
    used = sum(g.used_tokens for g in signal.groups)
    residents = sum(g.residents for g in signal.groups)
    mean = used / residents if residents else 0.0
    # A fresh sample takes about what a resident does; the estimate is capped at the
    # pool's size, so one period asks at most to double it.
    fresh = min(signal.fresh_waiting * mean, float(capacity))
    need = used + fresh
    aim = spec.target_utilization
    ranked = sorted(signal.groups, key=lambda g: _value(g, spec, rates), reverse=True)
    if capacity and need > capacity * min(1.0, aim + 0.1):
        why = (
            f"the pool's KV would be {need / capacity:.0%} used ({need:,.0f} of {capacity:,} "
            f"tokens, {signal.fresh_waiting} fresh samples waiting)"
        )
        out |= _grow(ranked, need / aim - capacity, why, spec)
    elif signal.fresh_waiting == 0 and capacity and need < capacity * max(0.0, aim - 0.35):
        kept = max([need, *(n for _, n in needs)])
        why = f"the pool's KV is {need / capacity:.0%} used and no fresh work waits"
        out |= _shrink(ranked, capacity - kept / aim, why, spec)
    for g in signal.groups:  # the tail
        more = min(spec.max_step, math.ceil(g.pending_tokens / max(1, g.capacity)))
        if g.pending_tokens > 0 and _bounded(g, g.replicas + more) > out[g.name][0]:
            out[g.name] = (
                _bounded(g, g.replicas + more),
                f"{g.pending_trajectories} trajectories ({g.pending_tokens:,} tokens) wait "
                f"for {g.name}",
            )
    waiting = sum(g.pending_tokens for g in signal.groups)
    if not any(out[g.name][0] for g in signal.groups) and (
        signal.fresh_waiting or signal.admission_room or residents or waiting
    ):
        keep = ranked[0]  # work remains: the pool keeps its best worker
        out[keep.name] = (1, f"work remains; {keep.name} keeps one worker")
    bounded = {g.name: (_bounded(g, out[g.name][0]), out[g.name][1]) for g in signal.groups}
    return bounded, need


def _grow(
    ranked: Sequence[GroupSignal], missing: float, why: str, spec: AutoscaleSpec
) -> dict[str, tuple[int, str]]:
    """The group that buys the most and can grow, by the KV `missing` (at most
    `max_step`); the rest, if any, next period, when it may have grown."""
    for g in ranked:
        room = g.max_replicas - g.replicas
        if room > 0:
            more = min(room, spec.max_step, math.ceil(missing / max(1, g.capacity)))
            return {g.name: (g.replicas + more, f"{why}; {g.name} buys the most {_per(spec)}")}
    return {}


def _shrink(
    ranked: Sequence[GroupSignal], spare: float, why: str, spec: AutoscaleSpec
) -> dict[str, tuple[int, str]]:
    """Workers whose KV is `spare`, from the groups that buy the least first."""
    out = {}
    for g in reversed(ranked):
        fewer = min(g.workers - g.min_replicas, spec.max_step, int(spare // max(1, g.capacity)))
        if fewer > 0:
            spare -= fewer * g.capacity
            out[g.name] = (g.workers - fewer, f"{why}; {g.name} buys the least {_per(spec)}")
    return out


def _per(spec: AutoscaleSpec) -> str:
    return "tok/$" if spec.objective == "throughput_per_dollar" else "tok/s per worker"


def _value(
    g: GroupSignal, spec: AutoscaleSpec, rates: Mapping[str, float]
) -> tuple[float, float, str]:
    """How much a worker of `g` buys: its measured tok/s per dollar-hour (or per worker
    for tail latency), as last measured; a group never measured by its KV per dollar
    (or its affinity)."""
    per_worker = rates.get(g.name, 0.0)
    if spec.objective == "throughput_per_dollar":
        return (
            per_worker / max(1e-9, g.worker_price),
            g.capacity / max(1e-9, g.worker_price),
            g.name,
        )
    return per_worker, float(g.affinity), g.name


def _bounded(g: GroupSignal, n: int) -> int:
    return max(g.min_replicas, min(g.max_replicas, n))


def _stabilised(
    g: GroupSignal,
    recommended: tuple[int, str],
    seen: tuple[tuple[float, int], ...],
    clock: tuple[float, float],
    spec: AutoscaleSpec,
) -> tuple[int, str]:
    """As Kubernetes' HPA: up to the least recommended over the scale-up window, down to
    the most recommended over the scale-down window, so a burst does not flap it; and
    neither before its window has been watched whole (`clock`: now, and for how long the
    rule has watched), since what came before is unknown."""
    want, why = recommended
    now, watched = clock
    if want > g.replicas:
        window = [n for t, n in seen if t >= now - spec.scale_up_stabilization_s]
        up = min(window) if watched >= spec.scale_up_stabilization_s else g.replicas
        if up > g.replicas:
            return up, why
        return g.replicas, f"holding: {why}; not yet for {spec.scale_up_stabilization_s:.0f} s"
    if want < g.replicas:
        down = max(n for _, n in seen) if watched >= spec.scale_down_stabilization_s else g.replicas
        if down < g.replicas:
            return down, why
        return g.replicas, f"holding: {why}; not yet for {spec.scale_down_stabilization_s:.0f} s"
    return g.replicas, why


def _within_budget(
    groups: Sequence[GroupSignal], target: dict[str, tuple[int, str]], budget: float
) -> dict[str, tuple[int, str]]:
    """Scale-outs cut, the lowest affinity first, until the pool at the larger of its
    workers now and its targets costs no more than the budget."""
    out = dict(target)

    def cost() -> float:
        return sum(max(g.workers, out[g.name][0]) * g.worker_price for g in groups)

    for g in sorted(groups, key=lambda x: (x.affinity, x.name)):
        while out[g.name][0] > max(g.workers, g.replicas) and cost() > budget + 1e-9:
            out[g.name] = (
                out[g.name][0] - 1,
                f"held by the budget ({budget:g}/h): {out[g.name][1]}",
            )
        if cost() <= budget + 1e-9:
            break
    return out
