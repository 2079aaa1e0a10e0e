"""`cadence run`: the example's pool (two groups, four emulated workers in two host
processes) trains to the end; every admitted sample ends once, and the measures are
in the JSON. A bad file exits 2 with the field path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.operator.cli import main

EXAMPLE = Path(__file__).parents[2] / "manifests" / "examples" / "trainingrun.yaml"


def test_a_short_run_of_the_example_ends_every_sample_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = tmp_path / "short.yaml"
    short.write_text(EXAMPLE.read_text().replace("iterations: 30", "iterations: 3"))
    out = tmp_path / "out.json"
    argv = ["run", str(short), "--json", str(out), "--workdir", str(tmp_path / "run")]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["workers"] == 4
    assert result["samples_admitted"] == 3 * 8 * 8
    assert result["samples_delivered"] == result["samples_admitted"]
    assert result["samples_lost"] == 0 and result["samples_duplicated"] == 0
    assert result["throughput_tok_s"] > 0 and result["tokens_per_dollar"] > 0
    assert 0 < result["latency_p50_s"] <= result["latency_p95_s"]
    assert len(result["reward_by_version"]) >= 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result


def test_a_bad_file_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("hMin: 256", "hMin: lots"))
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence: error: TrainingRun spec.scheduler.hMin:")
    assert err.count("\n") == 1
