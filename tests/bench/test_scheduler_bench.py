"""The scheduler bench runs end to end and reports what it promises (timings are not
asserted: they belong to the bench's numbers, not to a test)."""

from __future__ import annotations

import json

import pytest

from cadence.cli import main


def test_bench_prints_a_json_summary_on_its_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "scheduler", "--workers", "16", "--trajectories", "512", "--pending", "64"]
    assert main([*argv, "--cycles", "4", "--warmup", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    phases = [json.loads(line) for line in lines[:-1]]
    summary = json.loads(lines[-1])
    assert {p["phase"] for p in phases} == {"pacing", "concentration", "tail"}
    assert all(p["cycles"] == 4 and p["actions_per_cycle"] > 0 for p in phases)
    assert set(summary) >= {"workers", "trajectories", "pending", "cycle_ms_p50", "cycle_ms_p99"}
    assert summary["workers"] == 16
    assert summary["cycle_ms_p99"] >= summary["cycle_ms_p50"] > 0
    # Each phase in units of one sort of its residents, measured in the same process.
    for p in phases:
        assert p["calibration_ms"] > 0 and p["build_ms_p99"] >= p["build_ms_p50"]
        # Both times are printed to the microsecond; the ratio is computed before rounding.
        low = (p["cycle_ms_p99"] - 0.0005) / (p["calibration_ms"] + 0.0005)
        high = (p["cycle_ms_p99"] + 0.0005) / (p["calibration_ms"] - 0.0005)
        assert low - 0.005 <= p["cycle_ms_p99_over_calibration"] <= high + 0.005
    assert summary["cycle_ms_p99_over_calibration"] == max(
        p["cycle_ms_p99_over_calibration"] for p in phases
    )
