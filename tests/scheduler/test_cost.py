"""The step cost the scheduler reads, and the warning for a pinned floor it cannot cover."""

from __future__ import annotations

import pytest

from cadence.scheduler import ConfigError, StepCost
from cadence.scheduler.cost import floor_shortfall, floor_warning


def test_a_step_is_paced_by_memory_until_compute_overtakes_it() -> None:
    cost = StepCost(weights_s=0.010, kv_token_s=1e-7, seq_s=0.001, overhead_s=0.001)
    assert cost.step_s(5, 0) == pytest.approx(0.011)  # weights read once
    assert cost.step_s(20, 0) == pytest.approx(0.021)  # compute overtook the weights
    assert cost.step_s(5, 200_000) == pytest.approx(0.031)  # KV reads did


def test_a_worker_is_saturated_once_a_step_takes_over_twice_an_empty_one() -> None:
    cost = StepCost(weights_s=0.010, kv_token_s=1e-7, seq_s=0.001, overhead_s=0.0)
    assert not cost.saturated(20, 0) and cost.saturated(21, 0)
    assert not cost.saturated(1, 100_000) and cost.saturated(1, 100_001)


def test_a_floor_short_of_one_periods_growth_is_named() -> None:
    cost = StepCost(weights_s=0.010, kv_token_s=0.0, seq_s=0.0)  # 100 steps a second
    assert floor_shortfall(2_048, cost, 256, 100_000, period_s=1.0) == 25_600
    assert floor_shortfall(30_000, cost, 256, 100_000, period_s=1.0) is None
    said = floor_warning("group h800", 2_048, cost, 256, capacity=100_000, period_s=1.0)
    assert said is not None and said.startswith("h_min 2,048 is below one control period's")


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_step_cost_that_cannot_pace_is_refused(bad: float) -> None:
    with pytest.raises(ConfigError):
        StepCost(weights_s=bad, kv_token_s=0.0, seq_s=0.0)
    with pytest.raises(ConfigError):
        StepCost(weights_s=0.0, kv_token_s=0.0, seq_s=0.0)
