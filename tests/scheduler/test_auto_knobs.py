"""Auto floor and reserve: raised per worker to one control period of growth at its step
rate, never below the pinned values; pinned knobs are used as they are."""

from __future__ import annotations

from cadence.scheduler import EvictReason, plan

from .factories import make_cost, make_fresh, make_knobs, make_snapshot, make_worker
from .helpers import evictions, placed_on

# 10 ms a step: each resident grows 100 tokens in a 1 s control period.
FAST = make_cost(weights_ms=10.0)


def test_auto_floor_covers_one_period_of_every_residents_growth() -> None:
    # 31 residents x 100 tokens = 3,100 of growth before the next cycle; headroom 3,000.
    w = make_worker("w", capacity=20_000, residents=[500] * 30 + [2_000], cost=FAST)
    pinned = make_snapshot([w], knobs=make_knobs(h_min=2_048))
    assert evictions(plan(pinned)[0]) == []  # the pinned floor is met, the engine will not be
    auto = make_snapshot([w], knobs=make_knobs(h_min=2_048, auto_h_min=True))
    floor = [e for e in evictions(plan(auto)[0]) if e.reason is EvictReason.FLOOR]
    assert [e.context for e in floor] == [2_000]  # longest first, until 30 x 100 fits


def test_auto_reserve_is_one_period_per_resident_and_never_below_the_pinned_delta() -> None:
    fresh = [make_fresh(f"f{i:02d}", prompt=100) for i in range(40)]
    w = make_worker("w", capacity=10_000, cost=FAST)
    pinned = make_snapshot([w], fresh=fresh, admitted=1, total_groups=1, knobs=make_knobs(delta=50))
    auto = make_snapshot(
        [w], fresh=fresh, admitted=1, total_groups=1, knobs=make_knobs(delta=50, auto_delta=True)
    )
    # Threshold: 100 x n + reserve x n <= 10,000: n = 66 at 50 pinned, 50 at 100 auto.
    assert len(placed_on(plan(pinned)[0])) == 40
    assert len(placed_on(plan(auto)[0])) == 40
    many = [make_fresh(f"g{i:03d}", prompt=100) for i in range(100)]
    pinned = make_snapshot([w], fresh=many, admitted=1, total_groups=1, knobs=make_knobs(delta=50))
    auto = make_snapshot(
        [w], fresh=many, admitted=1, total_groups=1, knobs=make_knobs(delta=50, auto_delta=True)
    )
    assert len(placed_on(plan(pinned)[0])) == 66
    assert len(placed_on(plan(auto)[0])) == 50
    slow = make_worker("w", capacity=10_000, cost=make_cost(weights_ms=100.0))  # 10 a period
    auto = make_snapshot(
        [slow], fresh=many, admitted=1, total_groups=1, knobs=make_knobs(delta=50, auto_delta=True)
    )
    assert len(placed_on(plan(auto)[0])) == 66  # the pinned 50 stays the least


def test_a_worker_of_unknown_cost_keeps_the_pinned_values_under_auto() -> None:
    w = make_worker("w", capacity=20_000, residents=[500] * 30 + [2_000])
    auto = make_snapshot([w], knobs=make_knobs(h_min=2_048, auto_h_min=True, auto_delta=True))
    assert evictions(plan(auto)[0]) == []
