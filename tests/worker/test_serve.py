"""`cadence worker`: refuses bad settings in one sentence, serves, and drains on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from cadence.cli import main
from tests.helpers import eventually

from .factories import CADENCE, free_port, wait_healthy


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "a bearer token is required"),
        (["--accelerator", "TPU9"], {"CADENCE_TOKEN": "t"}, "unknown accelerator 'TPU9'"),
        (["--model", "GPT-9"], {"CADENCE_TOKEN": "t"}, "unknown model 'GPT-9'"),
        (["--token-file", "/nonexistent/token"], {}, "cannot read token file"),
        (["--env-timeout-s", "0"], {"CADENCE_TOKEN": "t"}, "--env-timeout-s must be positive"),
        (
            ["--port", "8000", "--kv-transfer-port", "8000"],
            {"CADENCE_TOKEN": "t"},
            "--kv-transfer-port 8000 is the API's --port too",
        ),
        (["--kv-transfer-port", "70000"], {"CADENCE_TOKEN": "t"}, "is not a TCP port"),
        (["--kv-pull-timeout-s", "nan"], {"CADENCE_TOKEN": "t"}, "must be positive"),
        (
            ["--kv-pull-timeout-s", "30"],
            {"CADENCE_TOKEN": "t"},
            "--kv-pull-timeout-s 30 must be below --kv-lease-s 30",
        ),
        (
            ["--kv-tokens", "1000", "--max-model-len", "1100"],
            {"CADENCE_TOKEN": "t"},
            "--kv-tokens 1000 cannot hold one --max-model-len 1100 context",
        ),
    ],
)
def test_bad_settings_exit_2_in_one_sentence(
    tiny_model: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    monkeypatch.delenv("CADENCE_TOKEN", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["worker", "--model-path", str(tiny_model), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence: error: ") and err.count("\n") == 1
    assert message in err


@pytest.mark.slow
def test_the_worker_serves_and_drains_on_sigterm(tiny_model: Path, tmp_path: Path) -> None:
    port = free_port()
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    proc = subprocess.Popen(
        [
            *CADENCE,
            "worker",
            "--model-path",
            str(tiny_model),
            "--port",
            str(port),
            "--token-file",
            str(token),
            "--grace-s",
            "5",
            "--id",
            "w0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        env={**os.environ},
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy([base], [proc], within_s=60)
        auth = {"Authorization": "Bearer s3cret"}
        state = httpx.get(f"{base}/v1/state", headers=auth).json()
        assert state["worker_id"] == "w0" and state["engine"] == "emulated"
        body = {
            "id": "t",
            "attempt": 0,
            "version": 0,
            "fresh": {"prompt_token_ids": [1, 2, 3], "max_tokens": 4000},
        }
        assert httpx.post(f"{base}/v1/trajectories", json=body, headers=auth).status_code == 200
        proc.send_signal(signal.SIGTERM)
        state = eventually(
            lambda: (s := httpx.get(f"{base}/v1/state", headers=auth).json())["parked"] and s,
            timeout_s=30,
            what="the worker draining, its resident parked",
        )
        assert state["draining"] and [p["id"] for p in state["parked"]] == ["t"]
        assert httpx.get(f"{base}/readyz").status_code == 503
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_sigusr1_holds_decoding_and_the_stall_shows_in_health_until_released(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The stall fault `--chaos-targets stall` deals: the worker goes on answering, and
    once its residents decode nothing for --stall-after-s its health says so."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *(*CADENCE, "worker", "--model-path", str(tiny_model), "--port", str(port)),
            *("--id", "w0", "--stall-after-s", "1", "--grace-s", "1"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        env={**os.environ, "CADENCE_TOKEN": "s3cret"},
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy([base], [proc], within_s=60)
        auth = {"Authorization": "Bearer s3cret"}
        proc.send_signal(signal.SIGUSR1)
        body = {
            "id": "t",
            "attempt": 0,
            "version": 0,
            "fresh": {"prompt_token_ids": [1, 2, 3], "max_tokens": 4000},
        }
        assert httpx.post(f"{base}/v1/trajectories", json=body, headers=auth).status_code == 200
        answer = eventually(
            lambda: (r := httpx.get(f"{base}/healthz")).status_code == 503 and r,
            timeout_s=60,
            what="the health probe saying the worker stalled",
        )
        assert answer.json()["reason"] == "stalled"
        state = httpx.get(f"{base}/v1/state", headers=auth).json()
        assert state["stalled"] and state["residents"][0]["generated"] == 0
        proc.send_signal(signal.SIGUSR1)
        eventually(
            lambda: httpx.get(f"{base}/healthz").status_code == 200,
            timeout_s=60,
            what="the worker decoding again",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
