"""The simulator reads the file `cadence run` takes: the pool's groups become scenario
groups, the run's batch and knobs the workload and scheduling, and `cadence sim` runs it
with `--set` overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.cli import main
from cadence.operator.api.files import load
from cadence.operator.api.resources import ResourceError
from cadence.operator.api.settings import knobs_of
from cadence.operator.api.simulate import SimWorkload, scenario_of
from tests.helpers import LONGTAIL, TRAINING_RUN

EXAMPLE = TRAINING_RUN


def test_the_example_becomes_a_scenario_of_the_same_pool_and_knobs() -> None:
    pool, run = load(EXAMPLE)
    scenario = scenario_of(pool, run, SimWorkload(prompt_tokens=30, update_seconds=0.5))
    assert [(g.name, g.accelerator, g.devices, g.affinity) for g in scenario.groups] == [
        ("h800", "H800", 2, 2),
        ("a910x", "A910X", 2, 1),
    ]
    assert [g.price_per_hour for g in scenario.groups] == [2.0, 1.2]
    w = scenario.workload
    assert (w.prompts_per_batch, w.samples_per_prompt, w.iterations) == (8, 8, 30)
    assert w.median_response_tokens == 12 and scenario.max_model_len == 30 + 12
    s = scenario.scheduling
    assert (s.eta, s.delta, s.h_min, s.control_period_s) == (1, "auto", "auto", 0.2)
    assert scenario.min_kv_tokens() == scenario.max_model_len + 256 + 16  # sized as the run
    assert scenario.trainer.update_seconds == 0.5


def test_compression_slows_the_modelled_hardware_as_the_emulation_does() -> None:
    pool, run = load(EXAMPLE)
    full = scenario_of(pool, run).physics
    slow = scenario_of(pool, run, SimWorkload(compression=0.1)).physics
    assert slow.decode_mfu == pytest.approx(full.decode_mfu * 0.1)
    assert slow.step_overhead_s == pytest.approx(full.step_overhead_s * 10)
    with pytest.raises(ValueError, match="between 0 and 1"):
        scenario_of(pool, run, SimWorkload(compression=2.0))


def test_cadence_sim_runs_the_run_file_with_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim.json"
    argv = ["sim", "--scenario", str(EXAMPLE), "--policies", "cadence,sync", "--json", str(out)]
    assert main([*argv, "--set", "batch.iterations=3"]) == 2
    assert "no section 'batch'" in capsys.readouterr().err
    assert main([*argv, "--set", "workload.iterations=3", "--set", "trainer.update_seconds=5"]) == 0
    policies = json.loads(out.read_text())["policies"]
    assert sorted(policies) == ["cadence", "sync"]
    # Five-second updates: sync waits for each, cadence (eta 1) rolls out meanwhile.
    assert policies["cadence"]["throughput_tok_s"] > policies["sync"]["throughput_tok_s"]


def test_the_long_tailed_file_simulates_on_the_pool_its_run_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool, run = load(LONGTAIL)
    scenario = scenario_of(pool, run)
    # The run's workers are sized for its auto floor and reserve, and so is the scenario:
    # the simulator's own sizing for full-size runs would refuse these small KV caches.
    knobs = scenario.scheduling.knobs()
    assert (knobs.h_min, knobs.delta) == (knobs_of(run).h_min, knobs_of(run).delta)
    assert [g.kv_tokens for g in scenario.groups] == [3390, 3045]
    assert scenario.workload.response_lengths is not None
    out = tmp_path / "sim.json"
    argv = ["sim", "--scenario", str(LONGTAIL), "--policies", "cadence", "--json", str(out)]
    assert main([*argv, "--set", "workload.iterations=2"]) == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["policies"]["cadence"]["throughput_tok_s"] > 0


def test_a_run_as_long_as_real_training_is_accepted_everywhere_and_past_the_bound_refused(
    tmp_path: Path, tiny_model: Path
) -> None:
    """A run of 1,001 iterations started its processes, then died on the trace header
    (the simulator stopped at 1,000); every part now takes the same bound."""
    from cadence.operator.api.settings import trainer_config  # noqa: PLC0415

    long = tmp_path / "long.yaml"
    long.write_text(TRAINING_RUN.read_text().replace("iterations: 30", "iterations: 5000"))
    pool, run = load(long)
    assert scenario_of(pool, run).workload.iterations == 5000
    assert trainer_config(run, tiny_model, tmp_path / "t", "cadence").iterations == 5000
    past = tmp_path / "past.yaml"
    past.write_text(TRAINING_RUN.read_text().replace("iterations: 30", "iterations: 1000001"))
    with pytest.raises(ResourceError, match=r"spec.batch.iterations: .*1000000"):
        load(past)
