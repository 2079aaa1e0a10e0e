"""`cadence bench loop` runs the real control loop against emulated worker hosts and the
trainer over HTTP, and reports its cycles as one JSON object."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from cadence.cli import main
from cadence.worker.engine import EngineRequest
from cadence.worker.randomsource import RandomTokenSource

FIELDS = (
    "workers",
    "hosts",
    "period_s",
    "seconds",
    "cycles",
    "cycle_ms_p50",
    "cycle_ms_p95",
    "observe_ms_p95",
    "plan_ms_p95",
    "apply_ms_p95",
    "reconcile_ms_p95",
    "cpu_ms_p95",
    "cycles_skipped",
    "bytes_observed_per_cycle",
    "bytes_actions_per_cycle",
    "rss_start_mb",
    "rss_end_mb",
    "rss_growth",
)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_loop_bench_observes_every_worker_every_cycle(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "loop", "--workers", "8", "--hosts", "2", "--seconds", "3"]
    assert main([*argv, "--warmup", "1", "--period", "0.5", "--compression", "0.05"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert all(k in out for k in FIELDS), [k for k in FIELDS if k not in out]
    assert out["workers"] == 8 and out["hosts"] == 2 and out["period_s"] == 0.5
    assert out["cycles"] > 0 and out["cycles_failed"] == 0
    assert out["observed_min"] == 8  # every measured cycle saw every worker
    assert out["workers_lost"] == 0 and out["action_errors"] == 0
    assert out["bytes_observed_per_cycle"] > 0 and out["residents_mean"] > 0
    assert out["rss_start_mb"] > 0 and out["rss_end_mb"] > 0
    assert 0 < out["cpu_ms_p50"] <= out["cpu_ms_p95"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--seconds", "0"], "--seconds and --period must be positive"),
        (["--period", "-1"], "--seconds and --period must be positive"),
        (["--compression", "2"], "--compression must be above 0 and at most 1"),
        (["--workers", "2", "--hosts", "3"], "--hosts 3 is more than --workers 2"),
    ],
)
def test_loop_bench_refuses_bad_options(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "loop", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def _requests(n: int) -> Sequence[EngineRequest]:
    return [EngineRequest(f"r{i}", [1, 2, 3], 10) for i in range(n)]


def test_random_token_source_is_seeded_and_avoids_what_it_is_told() -> None:
    a, b = RandomTokenSource(16, seed=3, avoid=[2]), RandomTokenSource(16, seed=3, avoid=[2])
    drawn = [s for _ in range(50) for s in a.next_tokens(_requests(4))]
    assert drawn == [s for _ in range(50) for s in b.next_tokens(_requests(4))]
    assert all(0 <= s.token < 16 and s.token != 2 for s in drawn)
    assert len({s.token for s in drawn}) > 8 and all(s.logprob < 0 for s in drawn)
    with pytest.raises(ValueError, match="no token to draw"):
        RandomTokenSource(1, avoid=[0])
