"""Every shipped scenario file validates and deploys (no pool that could strand work)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from cadence.scheduler import CadencePolicy
from cadence.sim.core import Simulation
from cadence.sim.scenario import Scenario
from tests.helpers import SCENARIO_DIR, TINY_SCENARIO

SCENARIOS = sorted(SCENARIO_DIR.glob("*.yaml"))


def test_the_seed_scenarios_are_all_there() -> None:
    names = {p.stem for p in SCENARIOS}
    for expected in (
        "seed-homo-qwen3-8b",
        "seed-homo-qwen3-14b",
        "seed-homo-qwen3-32b",
        "seed-32A",
        "seed-32B",
        "seed-16A16B",
        "seed-16A8H",
        "seed-16B8H",
        "seed-16A16B8H",
    ):
        assert expected in names


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_validates_and_deploys(path: Path) -> None:
    scenario = Scenario.load(path)
    sim = Simulation(scenario, CadencePolicy())
    assert sim.workers
    s = scenario.scheduling
    need = scenario.max_model_len + s.h_min_tokens + s.delta_tokens
    assert all(w.deployment.kv_capacity_tokens >= need for w in sim.workers.values())


def test_the_traced_sample_is_the_longest_single_turn_sample_of_the_second_batch() -> None:
    scenario = Scenario.load(TINY_SCENARIO)
    scenario = scenario.model_copy(
        update={"workload": scenario.workload.model_copy(update={"multi_turn_share": 0.5})}
    )
    b = scenario.workload.prompts_per_batch
    replay = scenario.groups_of_samples(random.Random(scenario.seed))
    second = [s for group in itertools.islice(replay, 2 * b) for s in group if s.group >= b]
    assert any(s.tool_calls for s in second)
    traced = next(s for s in second if s.id == scenario.traced_sample())
    assert not traced.tool_calls
    assert traced.group // b == 1
    assert traced.response_tokens == max(s.response_tokens for s in second if not s.tool_calls)
