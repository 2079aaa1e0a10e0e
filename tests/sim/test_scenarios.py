"""Every shipped scenario file validates and deploys (no pool that could strand work)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence.operator.scheduler import CadencePolicy
from cadence.sim.core import Simulation
from cadence.sim.scenario import Scenario

SCENARIOS = sorted((Path(__file__).parents[2] / "sim" / "scenarios").glob("*.yaml"))


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
    need = scenario.max_model_len + scenario.scheduling.h_min + scenario.scheduling.delta
    assert all(w.deployment.kv_capacity_tokens >= need for w in sim.workers.values())
