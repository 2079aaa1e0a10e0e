"""Work conservation: once a version's fresh work is exhausted, its tail moves to faster
workers with room, when the move pays, and never down in affinity."""

from __future__ import annotations

import pytest

from cadence.scheduler import CadencePolicy, ConfigError, EvictReason, plan

from .factories import make_cost, make_fresh, make_knobs, make_snapshot, make_worker
from .helpers import evictions, placed_on

SLOW = make_cost(weights_ms=40.0)
FAST = make_cost(weights_ms=10.0, prefill_token_us=10.0)


def test_the_tail_moves_up_to_an_idle_faster_worker_without_a_newer_version() -> None:
    slow = make_worker("slow", affinity=0, capacity=10_000, residents=[3000, 200], cost=SLOW)
    fast = make_worker("fast", affinity=1, capacity=10_000, cost=FAST)
    actions, state = plan(make_snapshot([slow, fast]))
    assert state.sources == {}  # no newer version: the paper's concentration does not start
    assert placed_on(actions) == {"slow-r0": "fast", "slow-r1": "fast"}  # longest first
    assert {e.reason for e in evictions(actions)} == {EvictReason.LIFT}


def test_a_move_that_costs_more_prefill_than_it_saves_is_not_made() -> None:
    dear = make_cost(weights_ms=10.0, prefill_token_us=100_000.0)  # 0.1 s a token
    slow = make_worker("slow", affinity=0, capacity=10_000, residents=[3000], cost=SLOW)
    fast = make_worker("fast", affinity=1, capacity=10_000, cost=dear)
    assert plan(make_snapshot([slow, fast]))[0] == []


def test_nothing_moves_down_in_affinity_or_while_fresh_work_remains() -> None:
    high = make_worker("high", affinity=1, capacity=10_000, residents=[3000], cost=SLOW)
    low = make_worker("low", affinity=0, capacity=10_000, cost=FAST)
    assert evictions(plan(make_snapshot([high, low]))[0]) == []
    slow = make_worker("slow", affinity=0, capacity=10_000, residents=[3000], cost=SLOW)
    fast = make_worker("fast", affinity=1, capacity=10_000, cost=FAST)
    fresh = make_snapshot([slow, fast], fresh=[make_fresh("f")], admitted=1, total_groups=1)
    assert evictions(plan(fresh)[0]) == []


def test_a_compute_bound_worker_sheds_its_tail_to_an_empty_peer() -> None:
    weak = make_cost(weights_ms=5.0, seq_ms=1.0, prefill_token_us=10.0)  # knee at 5 residents
    busy = make_worker("busy", capacity=100_000, residents=[4000] * 20, cost=weak)  # 20 ms steps
    idle = make_worker("idle", capacity=100_000, cost=weak)
    actions, _ = plan(make_snapshot([busy, idle]))
    moved = list(placed_on(actions).values())
    assert moved and set(moved) == {"idle"}
    assert len(moved) <= 10  # not so many that the empty peer ends up the slower one
    # Once the peer would step as slowly as the busy one does, nothing pays.
    even = make_worker("even", capacity=100_000, residents=[4000] * 10, cost=weak)
    peer = make_worker("peer", capacity=100_000, residents=[4000] * 10, cost=weak)
    assert evictions(plan(make_snapshot([even, peer]))[0]) == []


def test_without_step_costs_nothing_moves_and_the_ablation_turns_it_off() -> None:
    slow = make_worker("slow", affinity=0, capacity=10_000, residents=[3000])
    fast = make_worker("fast", affinity=1, capacity=10_000)
    assert plan(make_snapshot([slow, fast]))[0] == []
    slow = make_worker("slow", affinity=0, capacity=10_000, residents=[3000], cost=SLOW)
    fast = make_worker("fast", affinity=1, capacity=10_000, cost=FAST)
    snap = make_snapshot([slow, fast], knobs=make_knobs())
    assert CadencePolicy(lift=False).plan(snap, CadencePolicy().initial_state())[0] == []


def test_a_lift_switch_that_is_not_a_boolean_is_refused() -> None:
    # "false" from a settings file is truthy: taken as given it would turn lift on.
    with pytest.raises(ConfigError, match="'false' is not true or false"):
        CadencePolicy(lift="false")  # type: ignore[arg-type]
