"""`cadence sim --trace`: a run's trace replayed beside the run, the fitted step models
said, the scenario written out to edit, and a file that is no trace refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.cli import main
from cadence.common.trace import Summary, Trace, Writer
from cadence.sim.scenario import Scenario
from tests.common.trace_factories import steps, trace


def _write(path: Path, t: Trace) -> Path:
    w = Writer(path, t.header)
    w.write(*t.trajectories, *t.steps, *t.updates)
    if t.summary is not None:
        w.write(t.summary)
    w.close()
    return path


def _traced(tmp_path: Path) -> Path:
    t = trace(
        [[200, 300, 400, 900]] * 16,
        step_samples=steps("H800", efficiency=0.4, overhead_s=0.003),
        summary=Summary(wall_seconds=100, throughput_tok_s=5_000, latency_p95_s=50),
    )
    return _write(tmp_path / "trace.jsonl", t)


def test_a_trace_replays_its_own_policy_beside_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    assert main(["sim", "--trace", str(_traced(tmp_path)), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "step model of H800: bandwidth efficiency 0.4 and overhead 3 ms" in printed
    assert "replay of cadence:" in printed and "the run: 5,000.0 tok/s" in printed
    doc = json.loads(out.read_text())
    assert list(doc["policies"]) == ["cadence"]  # the traced run's policy
    replayed = doc["policies"]["cadence"]["throughput_tok_s"]
    assert doc["trace"]["ratio"]["throughput_tok_s"] == pytest.approx(replayed / 5_000, abs=1e-3)
    assert doc["trace"]["step_fits"][0]["accelerator"] == "H800"


def test_the_replayed_scenario_can_be_written_edited_and_run(tmp_path: Path) -> None:
    written = tmp_path / "replay.yaml"
    argv = ["sim", "--trace", str(_traced(tmp_path)), "--write-scenario", str(written)]
    assert main([*argv, "--set", "scheduling.eta=2"]) == 0
    scenario = Scenario.load(written)
    assert scenario.scheduling.eta == 2
    h800 = next(g for g in scenario.groups if g.accelerator == "H800")
    assert h800.efficiency is not None
    assert h800.efficiency.bandwidth_efficiency == pytest.approx(0.4)
    assert main(["sim", "--scenario", str(written), "--policies", "cadence"]) == 0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "give either --scenario FILE or --trace FILE"),
        (["--trace", "missing.jsonl"], "cannot read trace missing.jsonl"),
    ],
)
def test_a_missing_or_doubled_source_is_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    assert main(["sim", *argv]) == 2
    assert says in capsys.readouterr().err


def test_a_file_that_is_no_trace_is_exit_2_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "update", "at": 0, "version": 1, "seconds": 1}\n')
    assert main(["sim", "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence: error: ") and err.count("\n") == 1
    assert "does not start with a header" in err
    empty = _write(tmp_path / "empty.jsonl", trace([]))
    assert main(["sim", "--trace", str(empty)]) == 2
    assert "no delivered trajectory" in capsys.readouterr().err
