"""`cadence sim` on files a user plausibly writes wrong: each is one sentence and exit 2,
before anything runs, and a run that stops making progress ends early saying why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cadence.cli import main
from cadence.scheduler import Action, Admit, Snapshot
from cadence.sim.core import STALL_S, Simulation, StallError
from cadence.sim.scenario import Scenario
from tests.helpers import TINY_SCENARIO

TINY = TINY_SCENARIO


def _scenario(tmp_path: Path, **change: Any) -> Path:
    raw = yaml.safe_load(TINY.read_text())
    for dotted, value in change.items():
        node = raw
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _refused(capsys: pytest.CaptureFixture[str], path: Path, *argv: str) -> str:
    assert main(["sim", "--scenario", str(path), "--policies", "cadence", *argv]) == 2
    out, err = capsys.readouterr()
    assert "wall time" not in out  # refused before anything ran
    assert err.startswith("cadence: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def test_a_group_too_small_for_one_worker_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Qwen3-32B with 16K of KV needs two L40S; one makes no worker at all.
    path = _scenario(
        tmp_path,
        model="Qwen3-32B",
        groups=[
            {"name": "l40s", "accelerator": "L40S", "devices": 1},
            {"name": "h800", "accelerator": "H800", "devices": 2, "affinity": 1},
        ],
    )
    err = _refused(capsys, path)
    assert "group l40s: 1 x L40S make no worker" in err
    assert "tensor-parallel 2" in err


@pytest.mark.parametrize(
    ("knob", "value", "says"),
    [
        # 2M tokens of KV need all 8 devices of a910x; the group has 4.
        ("delta", 2_000_000, "group a910x: 4 x A910X make no worker"),
        # Qwen3-32B and 2M tokens fit on no degree of H800 at all.
        ("h_min", 2_000_000, "fits on no tensor-parallel degree up to 8 x A910X"),
    ],
)
def test_knobs_no_worker_can_hold_are_a_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], knob: str, value: int, says: str
) -> None:
    model = "Qwen3-32B" if knob == "h_min" else "Qwen3-8B"
    err = _refused(capsys, _scenario(tmp_path, model=model, **{f"scheduling__{knob}": value}))
    assert says in err


def test_h_min_that_raises_the_degree_is_said_in_the_output_and_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 400K tokens of floor do not fit beside Qwen3-8B on one H800 (381K); two do.
    path = _scenario(tmp_path, scheduling__h_min=400_000, workload__iterations=1)
    out_json = tmp_path / "out.json"
    assert (
        main(["sim", "--scenario", str(path), "--policies", "sync", "--json", str(out_json)]) == 0
    )
    out = capsys.readouterr().out
    assert "h800: 2 x H800 -> 1 worker(s) of tensor-parallel 2" in out
    assert "not 1: one device holds the model but not max_model_len + h_min + delta" in out
    h800 = json.loads(out_json.read_text())["deployments"]["h800"]
    assert (h800["tensor_parallel"], h800["workers"]) == (2, 1)
    assert "not 1" in h800["note"]


def test_a_file_that_is_not_utf8_is_a_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(TINY.read_text().replace("tiny", "tiny-caf\u00e9").encode("latin-1"))
    assert "is not UTF-8 text" in _refused(capsys, latin1)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    assert "is not UTF-8 text" in _refused(capsys, binary)


def test_broken_yaml_is_one_sentence_with_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ngroups:\n  - {name: a, devices: [1\nmodel: Qwen3-8B\n")
    err = _refused(capsys, broken)
    assert "is not valid YAML at line 4, column 6" in err


def test_a_pool_without_prices_writes_null_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Custom accelerators carry no price unless one is given.
    custom = {"memory_gb": 80, "bandwidth_tb_s": 2, "bf16_tflops": 400}
    path = _scenario(
        tmp_path,
        groups=[{"name": "x", "accelerator": "X1", "devices": 4, "custom": custom}],
        workload__iterations=1,
    )
    out_json = tmp_path / "out.json"
    assert (
        main(["sim", "--scenario", str(path), "--policies", "sync", "--json", str(out_json)]) == 0
    )
    assert "some accelerator of the pool has no price" in capsys.readouterr().out
    text = out_json.read_text()
    assert "Infinity" not in text
    assert json.loads(text)["policies"]["sync"]["tokens_per_dollar"] is None


def test_json_and_plots_together_write_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json, plots = tmp_path / "out.json", tmp_path / "plots"
    path = _scenario(tmp_path, workload__iterations=2)
    argv = ["--json", str(out_json), "--plots", str(plots)]
    assert main(["sim", "--scenario", str(path), "--policies", "cadence", *argv]) == 0
    assert json.loads(out_json.read_text())["policies"]["cadence"]["trajectories"] == 2 * 16 * 8
    assert (plots / "long_trajectory.png").stat().st_size > 0


def test_set_reaches_a_group_by_name_and_refuses_an_unknown_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _scenario(tmp_path, workload__iterations=1)
    out_json = tmp_path / "out.json"
    argv = ["--set", "groups.h800.devices=6", "--json", str(out_json)]
    assert main(["sim", "--scenario", str(path), "--policies", "sync", *argv]) == 0
    assert json.loads(out_json.read_text())["deployments"]["h800"]["workers"] == 6
    capsys.readouterr()
    err = _refused(capsys, path, "--set", "groups.tpu.devices=6")
    assert "no item named 'tpu'; there are a910x, biv150, h800" in err


class _Idle:
    """A policy that admits work and never starts it."""

    name = "idle"

    def initial_state(self) -> None:
        return None

    def staleness_bound(self, eta: int) -> int:
        return eta

    def plan(self, snapshot: Snapshot, state: None) -> tuple[list[Action], None]:
        return ([Admit(1)] if snapshot.admission.groups_admitted == 0 else []), None


def test_a_stalled_run_ends_early_naming_what_is_stuck() -> None:
    sim = Simulation(Scenario.load(TINY), _Idle())
    with pytest.raises(StallError) as stalled:
        sim.run()
    assert sim.now <= STALL_S + 2 * sim.scenario.scheduling.control_period_s
    message = str(stalled.value)
    assert message.startswith("idle stalled: nothing decoded for 600 simulated seconds")
    assert "8 fresh sample(s) of batch(es) [0]" in message
    assert "0 of 3 batches consumed" in message
    assert message.endswith("workers: 10 with no weights yet")


def test_yaml_nested_past_the_parser_is_a_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: " + "[" * 5_000 + "\n")
    assert "nests too deeply to read" in _refused(capsys, deep)
