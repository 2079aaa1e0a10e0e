"""The trainer's endpoints: deliveries accepted once and only from the current attempt,
admission under the staleness bound, and bad input refused with a sentence."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cadence.common.web import MAX_BODY_BYTES
from cadence.trainer.app import create_app
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer

from .factories import delivery

AUTH = {"Authorization": "Bearer s3cret"}


@pytest.fixture
def trainer(tiny_model: Path, tmp_path: Path) -> Iterator[Trainer]:
    config = TrainerConfig(
        model_path=tiny_model, state_dir=tmp_path, group_size=2, batch_groups=2, iterations=3, eta=1
    )
    t = Trainer(config)
    yield t
    t.ledger.close()


def _call(trainer: Trainer, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(trainer, "s3cret", train=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.request(method, path, **kwargs)

    return asyncio.run(go())


def test_admission_stops_at_the_staleness_bound(trainer: Trainer) -> None:
    r = _call(trainer, "POST", "/v1/admit", json={"groups": 10}, headers=AUTH)
    assert r.json() == {"groups": [0, 1, 2, 3]}  # (v + eta + 1) * B = 4 at version 0
    view = _call(trainer, "GET", "/v1/ledger", headers=AUTH).json()
    assert view["admission_limit"] == 4 and len(view["fresh"]) == 8
    assert set(view["prompts"]) == {"0", "1", "2", "3"}


def test_a_delivery_counts_once_and_only_from_the_current_attempt(trainer: Trainer) -> None:
    _call(trainer, "POST", "/v1/admit", json={"groups": 1}, headers=AUTH)
    record = {"attempt": 1, "state": "placed", "worker": "w0", "version": 0}
    assert _call(trainer, "POST", "/v1/samples/g0-s0/record", json=record, headers=AUTH).json()
    old = delivery("g0-s0", attempt=0).model_dump(mode="json")
    r = _call(trainer, "POST", "/v1/trajectories", json=old, headers=AUTH)
    assert r.status_code == 409 and r.json()["reason"] == "stale_attempt"
    current = delivery("g0-s0", attempt=1, prompt=trainer.ledger.group(0).prompt).model_dump(
        mode="json"
    )
    first = _call(trainer, "POST", "/v1/trajectories", json=current, headers=AUTH)
    again = _call(trainer, "POST", "/v1/trajectories", json=current, headers=AUTH)
    assert first.json()["result"] == "accepted" and again.json()["result"] == "duplicate"
    unknown = delivery("g9-s0").model_dump(mode="json")
    assert _call(trainer, "POST", "/v1/trajectories", json=unknown, headers=AUTH).status_code == 404


def test_ended_lists_accepted_deliveries_by_size_in_arrival_order(trainer: Trainer) -> None:
    _call(trainer, "POST", "/v1/admit", json={"groups": 1}, headers=AUTH)
    prompt = trainer.ledger.group(0).prompt
    for sid, tokens in (("g0-s1", (4, 5, 6)), ("g0-s0", (7,))):
        record = {"attempt": 1, "state": "placed", "worker": "w0", "version": 0}
        _call(trainer, "POST", f"/v1/samples/{sid}/record", json=record, headers=AUTH)
        body = delivery(sid, attempt=1, prompt=prompt, tokens=tokens).model_dump(mode="json")
        _call(trainer, "POST", "/v1/trajectories", json=body, headers=AUTH)
        _call(trainer, "POST", "/v1/trajectories", json=body, headers=AUTH)  # a duplicate
    page = _call(trainer, "GET", "/v1/ended", headers=AUTH).json()
    assert [(e["id"], e["turns"][0]["tokens"]) for e in page["items"]] == [
        ("g0-s1", 3),
        ("g0-s0", 1),
    ]
    assert page["items"][0]["prompt_tokens"] == len(prompt)
    later = _call(trainer, "GET", f"/v1/ended?after={page['last']}", headers=AUTH).json()
    assert later == {"items": [], "last": page["last"]}
    assert _call(trainer, "GET", "/v1/ended?limit=0", headers=AUTH).status_code == 422
    for beyond in (10**20, -(10**20), 2**63, -2):  # past what SQLite takes: a 422, not a 500
        r = _call(trainer, "GET", f"/v1/ended?after={beyond}", headers=AUTH)
        assert r.status_code == 422 and "after" in r.json()["error"], beyond


def test_bad_input_is_refused_with_a_sentence(trainer: Trainer) -> None:
    assert _call(trainer, "GET", "/v1/ledger").status_code == 401
    r = _call(trainer, "POST", "/v1/trajectories", json={"id": "x"}, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"]
    big = {"content-length": str(MAX_BODY_BYTES + 1), **AUTH}
    assert _call(trainer, "POST", "/v1/trajectories", content=b"{}", headers=big).status_code == 413
    assert _call(trainer, "GET", "/v1/weights/7", headers=AUTH).status_code == 404
    assert _call(trainer, "POST", "/v1/admit", json={"groups": 0}, headers=AUTH).status_code == 422


def test_version_zero_is_published_with_its_checksum(trainer: Trainer) -> None:
    info = _call(trainer, "GET", "/v1/version").json()
    assert info["version"] == 0 and len(info["sha256"]) == 64
    weights = _call(trainer, "GET", info["weights_path"], headers=AUTH)
    assert weights.status_code == 200 and len(weights.content) > 1000


def test_publishing_and_prompts_are_refused_outside_external_mode_or_with_a_bad_sha(
    trainer: Trainer, tiny_model: Path, tmp_path: Path
) -> None:
    body = {"version": 1, "weights_uri": str(tiny_model / "model.safetensors"), "sha256": "0" * 64}
    r = _call(trainer, "POST", "/v1/publish", json=body, headers=AUTH)
    assert r.status_code == 409 and r.json()["reason"] == "not_external"
    r = _call(trainer, "POST", "/v1/prompts", json={"prompts": [{"text": "hi"}]}, headers=AUTH)
    assert r.status_code == 409 and r.json()["reason"] == "not_external"

    external = Trainer(
        trainer.config.model_copy(
            update={"task": "external", "state_dir": tmp_path / "ext", "publish_from": tiny_model}
        )
    )
    r = _call(
        external,
        "POST",
        "/v1/prompts",
        json={"prompts": [{"text": "hi", "prompt_token_ids": [1]}]},
        headers=AUTH,
    )
    assert r.status_code == 422  # exactly one of text and token ids
    r = _call(external, "POST", "/v1/publish", json=body, headers=AUTH)
    assert r.status_code == 409 and "sha256" in r.json()["error"]  # and nothing published
    digest = hashlib.sha256((tiny_model / "model.safetensors").read_bytes()).hexdigest()
    assert digest not in r.json()["error"]  # no oracle of a file's contents
    assert external.ledger.version == 0 and not external.store.has(1)
    for outside in ("/etc/passwd", str(tiny_model / ".." / "x"), "http://169.254.169.254/w"):
        r = _call(
            external, "POST", "/v1/publish", json=body | {"weights_uri": outside}, headers=AUTH
        )
        assert r.status_code == 403 and r.json()["reason"] == "weights_source", outside
    external.ledger.close()
