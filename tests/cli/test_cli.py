"""The command line: subcommands listed, bad input refused with one sentence and exit 2."""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cadence.cli import main
from cadence.common.statelock import StateLock

FIGURE8 = Path(__file__).parents[2] / "bench" / "snapshots" / "figure8.json"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_the_subcommands() -> None:
    # The script installed beside this interpreter, whether or not its venv is on PATH.
    exe = shutil.which("cadence", path=str(Path(sys.executable).parent))
    assert exe is not None, "the console script is not installed"
    done = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True)
    assert "plan" in done.stdout
    assert "bench" in done.stdout


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["bench", "scheduler", "--workers", "0"],
        ["bench", "scheduler", "--pending", "many"],
        ["plan"],
        ["plan", "does-not-exist.json"],
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(argv, capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("cadence: error: ")
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_invalid_snapshot_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = json.loads(FIGURE8.read_text())
    snap["workers"][1]["capacity"] = -5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(snap))
    code, _, err = _run(["plan", str(bad)], capsys)
    assert code == 2
    assert "workers.1.capacity" in err
    bad.write_text("{not json")
    code, _, err = _run(["plan", str(bad)], capsys)
    assert code == 2
    assert "is not JSON" in err


def test_snapshot_refused_by_the_scheduler_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = json.loads(FIGURE8.read_text())
    snap["admission"]["groups_admitted"] = 99  # more than the total of 4
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(snap))
    code, _, err = _run(["plan", str(bad)], capsys)
    assert code == 2
    assert "exceeds the total" in err


def test_plan_replays_figure_8(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["plan", str(FIGURE8)], capsys)
    assert code == 0
    result = json.loads(out)
    places = {a["trajectory"]: a["worker"] for a in result["actions"] if a["action"] == "place"}
    evicts = [a["trajectory"] for a in result["actions"] if a["action"] == "evict"]
    assert places == {"t7": "w1", "t2": "w2"}
    assert evicts == ["t1"]
    assert result["state"] == {"sources": {}}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["trainer", "--model-path", "/nonexistent", "--state-dir", "s"],
            "holds no Hugging Face model",
        ),
        (["worker", "--hosted", "Bad_Id:H800:1"], "is not ID:ACCELERATOR:AFFINITY"),
        (["worker", "--hosted", "w0:TPU9:1"], "unknown accelerator 'TPU9'"),
        (["worker", "--hosted", "w0:H800:1:2"], "is not ID:ACCELERATOR:AFFINITY[:TP:MEMORY_SHARE]"),
        (["worker", "--hosted", "w0:H800:1:1:1.5"], "--memory-utilization 1.5 must be in (0, 1]"),
        (["worker", "--hosted", "w0:H800:1:0:0.5"], "--tensor-parallel must be at least 1"),
        (["worker", "--memory-utilization", "1.5"], "--memory-utilization 1.5 must be in (0, 1]"),
        (["run", "/nonexistent.yaml"], "cannot read /nonexistent.yaml"),
    ],
)
def test_service_commands_refuse_bad_settings_in_one_sentence(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("CADENCE_TOKEN", "t")
    # A fresh home: no default model yet. Bad settings are refused before one is made
    # (making it printed a progress bar into the one sentence).
    from cadence.worker import serve  # noqa: PLC0415

    monkeypatch.setattr(serve, "DEFAULT_MODEL_DIR", tmp_path / "tiny-llama")
    # An engine an earlier test left for the collector prints vLLM's AsyncLLM.__del__
    # noise to stderr when it is collected; collect it now, outside the sentence read.
    gc.collect()
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence: error: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "tiny-llama").exists()


EXAMPLE_RUN = Path(__file__).parents[2] / "manifests" / "examples" / "trainingrun.yaml"


@pytest.mark.parametrize(
    ("argv", "sentence"),
    [
        (["run", str(EXAMPLE_RUN), "--chaos", "0"], "--chaos takes the seconds between faults"),
        (["run", str(EXAMPLE_RUN), "--policy", "sync", "--compare", "a,b"], "not both"),
        (["bench", "agreement", "--compression", "2"], "--compression must be above 0"),
        (["bench", "agreement", "--policies", "nope"], "unknown policy nope"),
        (["operator"], "give --all-namespaces or one or more --namespace"),
        (["operator", "--all-namespaces", "--resync-s", "0"], "must be positive and finite"),
        (["trainer", "--config", "/nonexistent/trainer.json"], "cannot read /nonexistent"),
        (["trainer"], "give --model-path and --state-dir, or --config"),
    ],
)
def test_the_new_commands_refuse_bad_input_in_one_sentence(
    argv: list[str],
    sentence: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CADENCE_TOKEN", "s3cret")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert sentence in err and err.count("\n") == 1


def test_a_trainer_config_file_that_does_not_validate_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CADENCE_TOKEN", "s3cret")
    config = tmp_path / "trainer.json"
    config.write_text(
        json.dumps({"model_path": str(tmp_path), "state_dir": str(tmp_path), "eta": -1})
    )
    assert main(["trainer", "--config", str(config)]) == 2
    assert f"{config}: eta: Input should be greater than or equal to 0" in capsys.readouterr().err


def test_a_second_run_or_trainer_on_a_directory_in_use_is_refused_in_one_sentence(
    tmp_path: Path,
    tiny_model: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two runs on one --workdir trained the same batches and overwrote each other's
    weights; the second now stops before it starts anything."""
    monkeypatch.setenv("CADENCE_TOKEN", "s3cret")
    held = StateLock(tmp_path / "run.lock", "a run")
    assert main(["run", str(EXAMPLE_RUN), "--workdir", str(tmp_path), "--no-live"]) == 2
    err = capsys.readouterr().err
    assert f"the work directory {tmp_path} is in use by another process" in err
    assert err.count("\n") == 1 and not (tmp_path / "trainer").exists()
    held.release()

    state = tmp_path / "state"
    trainer = StateLock(state / "trainer.lock", "a trainer")
    argv = ["trainer", "--model-path", str(tiny_model), "--state-dir", str(state)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"the trainer state directory {state} is in use" in err and err.count("\n") == 1
    trainer.release()
