"""The command line: subcommands listed, bad input refused with one sentence and exit 2."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cadence.cli import build_parser, main
from cadence.cli import run as run_cli
from cadence.common.statelock import StateLock
from tests.helpers import TINY_SCENARIO

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
        ["dev", "cluster", "--claim", "models"],
        ["dev", "cluster", "--claim", "models=/does/not/exist"],
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
    assert "workers[" + snap["workers"][1]["id"] + "].capacity" in err
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
        (
            [
                "bench",
                "autoscale",
                "--scenario",
                str(EXAMPLE_RUN.parents[2] / "sim" / "scenarios" / "tiny-16A16B8H.yaml"),
            ],
            "has no autoscaling section to compare",
        ),
        (["operator"], "give --all-namespaces or one or more --namespace"),
        (["operator", "--all-namespaces", "--resync-s", "0"], "must be positive and finite"),
        (["trainer", "--config", "/nonexistent/trainer.json"], "cannot read /nonexistent"),
        (["trainer"], "give --model-path and --state-dir, or --config"),
        (
            ["trainer", "--model-path", "m", "--state-dir", "s", "--max-tokens", "2000000"],
            "--max-tokens: Input should be less than or equal to 1048576",
        ),
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


def test_a_pool_the_simulator_cannot_model_is_refused_before_a_run_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The resource and the simulator's pool had two sets of bounds: this validated as a
    resource, then failed the capacity check (run by the simulator) with a traceback."""
    big = tmp_path / "big.yaml"
    custom = "custom: {memoryGb: 200000, bandwidthTbS: 3, bf16Tflops: 900}"
    big.write_text(
        EXAMPLE_RUN.read_text().replace("accelerator: H800", f"accelerator: X1\n      {custom}")
    )
    assert main(["run", str(big), "--workdir", str(tmp_path / "w"), "--no-live"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "spec.groups[h800].custom.memoryGb: Input should be less than or equal to 100000" in err


def test_the_trainers_flags_leave_what_is_not_given_to_its_config() -> None:
    from cadence.cli.services import trainer_settings  # noqa: PLC0415
    from cadence.trainer.config import TrainerConfig  # noqa: PLC0415

    def config(*flags: str) -> TrainerConfig:
        args = build_parser().parse_args(
            ["trainer", "--model-path", "m", "--state-dir", "s", *flags]
        )
        return TrainerConfig(
            model_path=args.model_path, state_dir=args.state_dir, **trainer_settings(args)
        )

    assert config() == TrainerConfig(model_path=Path("m"), state_dir=Path("s"))
    assert config("--eta", "3", "--learning-rate", "0.5").model_dump() == {
        **TrainerConfig(model_path=Path("m"), state_dir=Path("s")).model_dump(),
        "eta": 3,
        "learning_rate": 0.5,
    }


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
    held = StateLock(tmp_path, "a run", note="run.lock")
    assert main(["run", str(EXAMPLE_RUN), "--workdir", str(tmp_path), "--no-live"]) == 2
    err = capsys.readouterr().err
    assert f"the work directory {tmp_path} is in use by another process" in err
    assert err.count("\n") == 1 and not (tmp_path / "trainer").exists()
    held.release()

    state = tmp_path / "state"
    trainer = StateLock(state, "a trainer", note="trainer.lock")
    argv = ["trainer", "--model-path", str(tiny_model), "--state-dir", str(state)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"the trainer state directory {state} is in use" in err and err.count("\n") == 1
    trainer.release()


def test_a_vary_over_eta_says_which_values_cannot_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "vary.json"
    argv = ["sim", "--scenario", str(TINY_SCENARIO), "--policies", "cadence"]
    assert main([*argv, "--vary", "scheduling.eta=0,2,5", "--json", str(out)]) == 0
    err = capsys.readouterr().err
    # Three iterations: no sample is trained more than two versions after it was made.
    assert "note: eta 2, 5 cannot differ: with 3 iterations" in err
    runs = json.loads(out.read_text())["values"]
    two, five = (
        {k: v for k, v in runs[eta]["cadence"].items() if k != "staleness_bound"}
        for eta in ("2", "5")
    )
    assert two == five
    assert runs["0"]["cadence"]["throughput_tok_s"] != two["throughput_tok_s"]
    assert main([*argv, "--vary", "scheduling.eta=0,1", "--json", str(out)]) == 0
    assert "cannot differ" not in capsys.readouterr().err


def test_ctrl_c_reaches_whoever_called_main(monkeypatch: pytest.MonkeyPatch) -> None:
    # A test suite running a command in process must be interrupted by Ctrl-C, not handed
    # a failed command to count and go on; the console script answers 130 itself.
    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(run_cli, "_cmd_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(["run", "manifests/examples/longtail.yaml"])


def test_sigterm_during_a_run_is_handed_on_to_the_previous_handler() -> None:
    seen: list[int] = []

    async def run_until_signalled() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(30)

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with pytest.raises(run_cli.Terminated):
            asyncio.run(run_cli._until_terminated(run_until_signalled()))
        assert seen == []  # the run's own handler took it, to stop its children first
        assert run_cli._terminate() == 143
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_run_without_a_workdir_keeps_its_files_in_an_ignored_runs_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    first, second = run_cli._new_workdir("longtail"), run_cli._new_workdir("longtail")
    assert first.parent == second.parent == Path("runs") and first != second
    assert first.is_dir() and first.name.startswith("longtail-")
    ignored = (Path(__file__).parents[2] / ".gitignore").read_text().split()
    assert "runs/" in ignored
