"""`cadence sim`: runs a scenario, writes the JSON document, refuses bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cadence.operator.cli import main

TINY = Path(__file__).parents[2] / "sim" / "scenarios" / "tiny-16A16B8H.yaml"


def test_sim_writes_the_json_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    assert main(["sim", "--scenario", str(TINY), "--policies", "cadence", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["scenario"] == "tiny-16A16B8H"
    assert doc["wall_seconds"] > 0
    entry = doc["policies"]["cadence"]
    for key in (
        "throughput_tok_s",
        "latency_p50_s",
        "latency_p95_s",
        "tokens_per_dollar",
        "trajectories",
        "migrations",
        "migrated_bytes",
        "preemptions",
        "simulated_seconds",
    ):
        assert key in entry
    assert entry["trajectories"] == 3 * 16 * 8
    assert "cadence" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"groups": [{"name": "x", "accelerator": "TPU9", "devices": 1}]}, "groups.0"),
        ({"workload": {"iterations": 0}}, "workload.iterations"),
        ({"model": "GPT-9"}, "unknown model"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_scenario_is_exit_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object], message: str
) -> None:
    raw = yaml.safe_load(TINY.read_text())
    raw.update(change)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    assert main(["sim", "--scenario", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence: error: ") and err.count("\n") == 1
    assert message in err


def test_unknown_policy_and_missing_file_are_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--scenario", str(TINY), "--policies", "nope"]) == 2
    assert "available: cadence" in capsys.readouterr().err
    assert main(["sim", "--scenario", "missing.yaml"]) == 2
    assert "cannot read scenario" in capsys.readouterr().err
