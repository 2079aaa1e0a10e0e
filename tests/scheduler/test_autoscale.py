"""The autoscaler's rule: a pool short of KV grows the group that buys the most, the tail
grows the group it waits for, a pool with little to do lets the group that buys the
least go once that has lasted, and no decision ever makes the pool cost more than its
budget."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cadence.scheduler.autoscale import (
    AutoscaleSpec,
    AutoscaleState,
    Decision,
    GroupSignal,
    PoolSignal,
    decide,
)

CAP = 10_000  # every group's worker holds this much KV


def group(name: str, **kw: Any) -> GroupSignal:
    base: dict[str, Any] = {
        "name": name,
        "affinity": {"cheap": 0, "mid": 1, "fast": 2}.get(name, 0),
        "capacity": CAP,
        "worker_price": {"cheap": 1.0, "mid": 2.0, "fast": 4.0}.get(name, 1.0),
        "workers": 2,
        "replicas": 2,
        "min_replicas": 0,
        "max_replicas": 10,
        "decode_tok_s": 200.0,  # 100 tok/s a worker: the cheap group buys the most per $
    }
    return GroupSignal(**(base | kw))


def pool(*groups: GroupSignal, fresh: int = 0, room: int = 0, now: float = 0.0) -> PoolSignal:
    return PoolSignal(tuple(groups), fresh_waiting=fresh, admission_room=room, now=now)


SPEC = AutoscaleSpec(
    budget_per_hour=100.0,
    period_s=30,
    scale_up_stabilization_s=60,
    scale_down_stabilization_s=120,
)


def run(signals: list[PoolSignal], spec: AutoscaleSpec = SPEC) -> list[list[Decision]]:
    """Decide on each signal in turn, 30 s apart, applying the targets as it goes."""
    state, out = AutoscaleState(), []
    replicas: dict[str, int] = {}
    for i, p in enumerate(signals):
        groups = tuple(replace(g, replicas=replicas.get(g.name, g.replicas)) for g in p.groups)
        decided, state = decide(replace(p, groups=groups, now=30.0 * i), spec, state)
        decisions = [d for d in decided if d.changed]
        replicas |= {d.group: d.replicas for d in decisions}
        out.append(decisions)
    return out


def _full(**kw: Any) -> list[GroupSignal]:
    """Three groups with their KV full, residents 1,000 tokens each."""
    return [group(n, used_tokens=2 * CAP, residents=40, **kw) for n in ("cheap", "mid", "fast")]


def test_a_pool_short_of_kv_grows_the_group_that_buys_the_most_once_it_lasts() -> None:
    short = pool(*_full(), fresh=100, room=4)
    first, second, third = run([short] * 3)
    assert first == second == []  # a minute's scale-up window: not on 30 s of readings
    (d,) = third
    assert d.group == "cheap" and d.replicas > 2
    assert "fresh samples waiting" in d.reason and "cheap buys the most tok/$" in d.reason


def test_tail_latency_grows_the_fastest_workers_instead() -> None:
    short = pool(*_full(), fresh=100, room=4)
    spec = replace(SPEC, objective="tail_latency")
    fast = {g.name: g for g in _full()}["fast"]
    faster = replace(fast, decode_tok_s=400.0)  # the fastest per worker
    signals = [pool(*(g if g.name != "fast" else faster for g in short.groups), fresh=100)] * 3
    assert [d.group for d in run(signals, spec)[2]] == ["fast"]


def test_the_tail_grows_the_group_it_waits_for() -> None:
    tail = pool(
        group("cheap", used_tokens=CAP, residents=10),
        group("fast", used_tokens=CAP, residents=2, pending_tokens=25_000, pending_trajectories=3),
    )
    (d,) = run([tail] * 3)[2]
    assert d.group == "fast" and d.replicas == 2 + 3  # a worker for each worker's worth
    assert d.reason == "3 trajectories (25,000 tokens) wait for fast"


def test_little_to_do_lets_the_group_that_buys_least_go_after_the_window() -> None:
    quiet = pool(group("cheap", used_tokens=500, residents=1), group("fast", residents=0))
    decided = run([quiet] * 6)
    assert decided[:4] == [[]] * 4  # 120 s of scale-down window, seen whole first
    # 500 tokens of work: one cheap worker holds it; the fast ones buy the least.
    assert [(d.group, d.replicas) for d in decided[4]] == [("cheap", 1), ("fast", 0)]
    assert "no fresh work waits; fast buys the least tok/$" in decided[4][1].reason


def test_a_group_never_goes_below_its_minimum_and_work_keeps_a_worker() -> None:
    quiet = pool(group("cheap", min_replicas=2), group("fast", min_replicas=1), room=3)
    assert run([quiet] * 8)[-1] == []
    nothing = pool(group("cheap", workers=1, replicas=1), fresh=0, room=2)
    assert all(d.replicas >= 1 for ds in run([nothing] * 8) for d in ds)


def test_no_decision_makes_the_pool_cost_more_than_its_budget() -> None:
    spec = replace(SPEC, budget_per_hour=14.0)  # 2 cheap + 2 mid + 2 fast cost 14
    short = pool(*_full(), fresh=1_000, room=4)
    decided = run([short] * 4, spec)
    assert all(d.replicas <= 2 for ds in decided for d in ds)
    # Every group is held where it is, and the status says why.
    state = AutoscaleState()
    for i in range(4):
        every, state = decide(replace(short, now=30.0 * i), spec, state)
    cheap = next(d for d in every if d.group == "cheap")
    assert not cheap.changed and cheap.replicas == 2
    assert cheap.reason.startswith("held by the budget (14/h): ")


def test_a_scale_out_paid_by_a_scale_in_waits_for_the_scale_in() -> None:
    """The fast group is being let go (3 workers still there, 1 wanted): the cheap
    group's scale-out may spend only what is left with all 3 counted."""
    spec = replace(SPEC, budget_per_hour=16.0)
    groups = (
        group("cheap", used_tokens=2 * CAP, residents=40),
        group("fast", workers=3, replicas=1, used_tokens=CAP, residents=1),
    )
    signals = [pool(*groups, fresh=1_000, room=4)] * 3
    for ds in run(signals, spec):
        cheap = next((d.replicas for d in ds if d.group == "cheap"), 2)
        assert cheap * 1.0 + 3 * 4.0 <= 16.0
