"""Replaying a trace: the workload the run saw and the step model its workers showed
become the scenario, and a trace that holds too little is refused with a sentence."""

from __future__ import annotations

import random

import pytest

from cadence.common.catalog import MODELS
from cadence.common.trace import Summary
from cadence.sim import compare
from cadence.sim.replay import ReplayError, group_correlation, replay
from tests.common.trace_factories import steps, trace, trajectories


def _efficiency(scenario: object, accelerator: str) -> tuple[float, float]:
    for g in scenario.deployments():  # type: ignore[attr-defined]
        d = g.deployment
        if d.accelerator.name == accelerator:
            return d.efficiency.bandwidth, d.efficiency.step_overhead_s
    raise AssertionError(accelerator)


def test_the_step_model_is_fitted_per_accelerator_type_from_its_samples() -> None:
    samples = [
        *steps("H800", efficiency=0.42, overhead_s=0.004),
        *steps("A910X", efficiency=0.2, overhead_s=0.011, seed=1),
    ]
    r = replay(trace(step_samples=samples))
    fits = {f.accelerator: f for f in r.fits}
    assert set(fits) == {"H800", "A910X"}  # BI-V150 has no samples: as the scenario had it
    assert fits["H800"].bandwidth_efficiency == pytest.approx(0.42, rel=1e-6)
    assert fits["H800"].step_overhead_s == pytest.approx(0.004, rel=1e-6)
    assert fits["H800"].error_pct < 0.01 < fits["H800"].error_before_pct
    assert _efficiency(r.scenario, "A910X") == pytest.approx((0.2, 0.011), rel=1e-6)
    before = _efficiency(replay(trace()).scenario, "BI-V150")
    assert _efficiency(r.scenario, "BI-V150") == before


def test_noisy_samples_fit_with_a_reported_error() -> None:
    rng = random.Random(3)
    exact = steps("H800", efficiency=0.3, overhead_s=0.002, samples=200)
    noisy = [s.model_copy(update={"seconds": s.seconds * rng.uniform(0.9, 1.1)}) for s in exact]
    fit = replay(trace(step_samples=noisy)).fits[0]
    assert fit.bandwidth_efficiency == pytest.approx(0.3, rel=0.05)
    assert 1.0 < fit.error_pct < 10.0


def test_the_workload_is_the_traced_one() -> None:
    r = replay(trace([[10, 20], [30, 40]], updates=(2.0, 4.0), tool_seconds=0.25))
    w = r.scenario.workload
    assert w.prompt_tokens == 40 and w.multi_turn_share == 1.0 and w.observation_tokens == 16
    assert w.response_lengths is not None
    assert sorted(w.response_lengths.values) == [10, 20, 30, 40]  # type: ignore[union-attr]
    assert w.env_latency is not None and w.env_latency.values == [0.25] * 4  # type: ignore[union-attr]
    assert r.scenario.trainer.update_seconds == 3.0
    assert r.scenario.name.endswith("-replay")


def test_an_advance_costs_what_the_runs_took() -> None:
    summary = Summary(wall_seconds=1, throughput_tok_s=1, advance_seconds=2.0)
    scenario = replay(trace(summary=summary)).scenario
    weights_gb = MODELS["Qwen3-8B"].weight_bytes / 1e9
    assert scenario.physics.weights_load_gb_s == pytest.approx(weights_gb / 2.0)


def test_group_correlation_is_high_when_groups_share_their_lengths() -> None:
    rng = random.Random(0)
    shared = [[n] * 8 for n in rng.sample(range(100, 10_000), 30)]
    independent = [[rng.randint(100, 10_000) for _ in range(8)] for _ in range(30)]
    assert group_correlation(trajectories(shared)) > 0.95
    assert group_correlation(trajectories(independent)) < 0.15


def test_a_replay_runs_in_the_simulator() -> None:
    r = replay(trace([[200, 300, 400, 900]] * 16))
    result = compare.run(r.scenario, ["cadence"], {})[0]
    assert result.trajectories == 3 * 16 * 8  # the tiny scenario's batches, replayed


def test_a_trace_without_deliveries_is_refused() -> None:
    with pytest.raises(ReplayError, match="no delivered trajectory"):
        replay(trace([]))
