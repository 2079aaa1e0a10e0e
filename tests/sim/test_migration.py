"""The simulator moves a trajectory by the scheduler's move rule and the migration knob:
a KV pull iff the knob is not reprefill and source and destination share a transfer
group, and it reports moves by kind."""

from __future__ import annotations

from typing import Any

import pytest

from cadence.common.catalog import MODELS
from cadence.scheduler import CadencePolicy
from cadence.scheduler.registry import POLICIES
from cadence.sim.compare import with_setting
from cadence.sim.core import Simulation
from cadence.sim.records import Result
from cadence.sim.scenario import Scenario
from tests.helpers import TINY_SCENARIO


def _run(policy: Any = None, **settings: Any) -> tuple[Simulation, Result]:
    scenario = Scenario.load(TINY_SCENARIO)
    for path, value in settings.items():
        scenario = with_setting(scenario, path.replace("__", "."), value)
    sim = Simulation(scenario, policy if policy is not None else CadencePolicy())
    return sim, sim.run()


def test_scenario_migration_reaches_the_scheduler_knobs() -> None:
    sim, _ = _run(scheduling__migration="kv")
    assert sim.knobs.migration == "kv"
    assert sim.snapshot().knobs.migration == "kv"


def test_workers_of_one_type_and_degree_share_a_transfer_group() -> None:
    sim = Simulation(Scenario.load(TINY_SCENARIO), CadencePolicy())
    groups = {w.id: w.transfer_group for w in sim.workers.values()}
    assert groups["h800-0"] == groups["h800-1"] is not None
    assert groups["h800-0"] != groups["a910x-0"]
    views = {v.id: v.transfer_group for v in sim.snapshot().workers}
    assert views == groups
    assert sim.snapshot().transfer is not None


def test_no_kv_link_means_no_transfer_group() -> None:
    scenario = with_setting(Scenario.load(TINY_SCENARIO), "physics.kv_transfer", False)
    sim = Simulation(scenario, CadencePolicy())
    assert all(w.transfer_group is None for w in sim.workers.values())
    result = sim.run()
    assert result.migrations_kv == 0 and result.migrations_reprefill == result.migrations


def test_auto_on_a_mixed_pool_reports_both_kinds_adding_up() -> None:
    # A reserve of 8K tokens a resident keeps the workers short of room, so residents
    # move often, across types too.
    _, result = _run(scheduling__delta=8192)
    assert result.migrations_kv > 0 and result.migrations_reprefill > 0
    assert result.migrations == result.migrations_kv + result.migrations_reprefill
    kv_bytes = MODELS["Qwen3-8B"].kv_bytes_per_token
    assert result.migrated_kv_bytes > 0
    assert result.reprefilled_kv_bytes == pytest.approx(result.reprefilled_tokens * kv_bytes)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_counts_by_kind_add_up_for_every_policy(name: str) -> None:
    _, result = _run(POLICIES[name]())
    assert result.migrations == result.migrations_kv + result.migrations_reprefill
    assert (result.migrated_kv_bytes > 0) is (result.migrations_kv > 0)


def test_reprefill_never_pulls() -> None:
    _, result = _run(scheduling__migration="reprefill")
    assert result.migrations > 0
    assert result.migrations_kv == 0 and result.migrated_kv_bytes == 0.0
    assert result.migrations_reprefill == result.migrations


def test_kv_moves_only_within_a_group_on_a_pool_where_each_group_serves_every_version() -> None:
    """Every type of the tiny pool has several workers, so a departed trajectory always
    has a worker of its group serving its version: under kv no move re-prefills."""
    _, result = _run(scheduling__migration="kv")
    assert result.migrations > 0
    assert result.migrations_reprefill == 0
    assert result.migrations_kv == result.migrations


def test_reprefill_moves_take_engine_time_that_pulls_do_not() -> None:
    """A pull only delays the moved trajectory; a re-prefill occupies the destination."""
    auto, _ = _run(scheduling__migration="auto")
    reprefill, _ = _run(scheduling__migration="reprefill")
    prefill = {
        sim: sum(w.engine.prefill_seconds for w in sim.workers.values())
        for sim in (auto, reprefill)
    }
    assert prefill[reprefill] > prefill[auto]
