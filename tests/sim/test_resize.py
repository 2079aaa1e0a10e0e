"""The simulated pool resizing itself by the autoscaler's rule: a pool short of KV grows,
an idle one shrinks, it never costs more than its budget at any period, and every
sample ends exactly once whatever workers came and went."""

from __future__ import annotations

import random
from typing import Any

import pytest

from cadence.sim.compare import make_policy
from cadence.sim.core import Simulation
from cadence.sim.scenario import Scenario


def _scenario(**autoscaling: Any) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "resizing",
            "model": "Qwen3-32B",
            "max_model_len": 16_384,
            "groups": [
                {"name": "a910x", "accelerator": "A910X", "devices": 2, "max_workers": 4},
                {
                    "name": "h800",
                    "accelerator": "H800",
                    "devices": 1,
                    "affinity": 1,
                    "max_workers": 3,
                },
            ],
            "physics": {"memory_utilisation": 0.92, "reserve_gb": 1.0},
            "workload": {
                "prompts_per_batch": 16,
                "samples_per_prompt": 8,
                "iterations": 4,
                "median_response_tokens": 1_500,
                "response_growth": 0.5,
            },
            "trainer": {"update_seconds": 30},
            "scheduling": {"eta": 0},
            "autoscaling": {
                "budget_per_hour": 8.0,
                "period_s": 20,
                "scale_up_stabilization_s": 40,
                "scale_down_stabilization_s": 120,
                "start_s": 30,
                **autoscaling,
            },
        }
    )


def test_a_pool_short_of_kv_grows_within_its_budget_and_loses_nothing() -> None:
    scenario = _scenario()
    result = Simulation(scenario, make_policy("cadence", {})).run()
    scaled = result.extras["autoscaling"]
    start = {d.group: d.workers for d in scenario.deployments()}
    grew = [d for d in scaled["decisions"] if d["replicas"] > start[d["group"]]]
    shrank = [d for d in scaled["decisions"] if d["replicas"] < start[d["group"]]]
    assert grew and "buys the most tok/$" in grew[0]["reason"], scaled["decisions"]
    assert shrank and "no fresh work waits" in shrank[0]["reason"]
    assert all(s["cost_per_hour"] <= 8.0 + 1e-9 for s in scaled["sizes"])
    w = scenario.workload
    assert result.trajectories == w.iterations * w.prompts_per_batch * w.samples_per_prompt
    assert 0 < scaled["mean_cost_per_hour"] <= 8.0


def test_responses_grow_batch_by_batch_from_the_same_draws() -> None:
    grown = _scenario()
    flat = Scenario.model_validate(
        grown.model_dump(exclude_unset=True)
        | {"workload": {**grown.workload.model_dump(exclude_unset=True), "response_growth": 0.0}}
    )
    b = grown.workload.prompts_per_batch
    pairs = []
    for scenario in (flat, grown):
        groups = scenario.groups_of_samples(random.Random(0))
        samples = [s for _ in range(2 * b) for s in next(groups)]
        pairs.append([s.response_tokens for s in samples])
    first, second = pairs
    per_batch = b * grown.workload.samples_per_prompt
    assert second[:per_batch] == first[:per_batch]  # batch 0 as drawn
    room = grown.max_model_len - grown.workload.prompt_tokens  # the cap
    expected = [min(room, round(n * 1.5)) for n in first[per_batch:]]
    assert expected == pytest.approx(second[per_batch:], abs=1)
