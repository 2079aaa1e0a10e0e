"""Comparisons: a baseline's unknown parameters are swept and its best setting reported."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from cadence.scheduler.registry import SWEEPS
from cadence.sim import compare
from cadence.sim.scenario import Scenario
from tests.helpers import SCENARIO_DIR, TINY_SCENARIO

TINY = TINY_SCENARIO


def test_sweep_reports_the_best_throughput_and_every_setting_tried() -> None:
    (result,) = compare.run(Scenario.load(TINY), ["dora"], {}, sweep=True)
    tried = result.extras["sweep"]
    assert len(tried) == len(SWEEPS["dora"])
    assert result.throughput_tok_s == max(t["throughput_tok_s"] for t in tried)
    assert result.extras["settings"] in [t["settings"] for t in tried]


def test_fixed_settings_apply_and_unknown_ones_are_refused_before_running() -> None:
    (result,) = compare.run(
        Scenario.load(TINY), ["laminar"], {"laminar": {"decode_batch_bound": 64}}
    )
    assert result.extras["settings"] == {"decode_batch_bound": 64}
    with pytest.raises(compare.UnknownSetting, match="no parameter bogus"):
        compare.run(Scenario.load(TINY), ["cadence", "laminar"], {"laminar": {"bogus": 1}})


def test_vary_runs_each_value_of_one_scenario_field() -> None:
    by_value = compare.vary(Scenario.load(TINY), ["cadence"], "scheduling.eta", [0, 2])
    assert list(by_value) == [0, 2]
    # eta = 0 is synchronous: more waiting, so a longer run than eta = 2.
    assert by_value[0][0].simulated_seconds > by_value[2][0].simulated_seconds
    with pytest.raises(compare.UnknownSetting, match="no field"):
        compare.vary(Scenario.load(TINY), ["cadence"], "scheduling.bogus", [1])


def test_laminar_is_held_to_eta_and_its_native_variant_runs_ahead() -> None:
    scenario = compare.with_setting(Scenario.load(TINY), "workload.iterations", 6)
    held, native = compare.run(scenario, ["laminar", "laminar-native"], {})
    assert (held.staleness_bound, native.staleness_bound) == (1, 4)
    assert held.max_version_lag <= 1
    assert native.max_version_lag > 1  # it does use the staleness it is allowed
    assert held.extras["settings"] == native.extras["settings"] == {}


@pytest.mark.parametrize(
    ("path", "value"),
    [("scheduling.eta", 2), ("workload.prompts_per_batch", 8), ("groups.h800.devices", 16)],
)
def test_a_setting_keeps_a_scenarios_length_law(path: str, value: object) -> None:
    # The shipped reasoning mix gives `response_lengths`; writing the defaults back beside
    # it (the lognormal's median and sigmas) made every --set and --vary refuse it.
    scenario = Scenario.load(SCENARIO_DIR / "reasoning-mix-16A16B8H.yaml")
    assert scenario.workload.response_lengths is not None
    changed = compare.with_setting(scenario, path, value)
    assert changed.workload.response_lengths == scenario.workload.response_lengths
    assert changed != scenario


class _Recorder:
    def __init__(self) -> None:
        self.seen: dict[str, list[int]] = {}

    def run_started(self, label: str, batches: int) -> Callable[[int, float], None]:
        consumed = self.seen.setdefault(label, [])
        return lambda done, at: consumed.append(done)


def test_runs_in_worker_processes_give_the_results_of_runs_one_after_another() -> None:
    scenario = Scenario.load(TINY)
    alone = compare.run(scenario, ["cadence", "dora"], {})
    progress = _Recorder()
    together = compare.run(scenario, ["cadence", "dora"], {}, jobs=2, progress=progress)
    assert [dataclasses.asdict(r) for r in together] == [dataclasses.asdict(r) for r in alone]
    batches = list(range(1, scenario.workload.iterations + 1))
    assert progress.seen == {"cadence": batches, "dora": batches}
