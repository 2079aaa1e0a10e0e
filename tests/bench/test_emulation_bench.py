"""`cadence bench emulation` runs emulated workers side by side and reports their pace."""

from __future__ import annotations

import json

import pytest

from cadence.cli import main


def test_emulation_bench_reports_each_workers_pace(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "emulation", "--workers", "2", "--residents", "2", "--seconds", "1"]
    assert main([*argv, "--compression", "0.05"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    h800, a910x = out["per_worker"]
    assert (h800["accelerator"], a910x["accelerator"]) == ("H800", "A910X")
    assert a910x["modelled_step_ms"] > h800["modelled_step_ms"]  # the slower accelerator
    assert all(0 < w["pace"] <= 1.05 and w["steps"] >= 1 for w in out["per_worker"])
    assert out["pace_min"] == min(w["pace"] for w in out["per_worker"])


def test_emulation_bench_refuses_a_nonpositive_compression(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "emulation", "--compression", "0"]) == 2
    assert "--compression and --seconds must be positive" in capsys.readouterr().err
