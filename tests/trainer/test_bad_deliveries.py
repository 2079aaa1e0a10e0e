"""No accepted delivery stops training (issue 19): a delivery that could not be trained
on is refused at ingest (422, one sentence, logged as an invalid arrival) and its sample
stays in flight for the loop to re-queue; a sample that fails anyway at update time is
masked and the batch trains without it; an update that cannot be made says so in the
trainer's health; a sample re-queued MAX_REQUEUES times ends failed instead of cycling."""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from cadence.trainer import grpo
from cadence.trainer import trainer as trainer_module
from cadence.trainer.app import create_app
from cadence.trainer.config import TrainerConfig
from cadence.trainer.ledger import MAX_REQUEUES
from cadence.trainer.trainer import Trainer

from .factories import delivery

AUTH = {"Authorization": "Bearer s3cret"}
POISON = 999  # a token id the patched scorer chokes on


@pytest.fixture
def trainer(tiny_model: Path, tmp_path: Path) -> Iterator[Trainer]:
    config = TrainerConfig(
        model_path=tiny_model, state_dir=tmp_path, group_size=2, batch_groups=1, iterations=2
    )
    t = Trainer(config)
    t.admit(1)
    yield t
    t.ledger.close()


def _call(trainer: Trainer, method: str, path: str, body: Any = None) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(trainer, "s3cret", train=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            content = None if body is None else json.dumps(body)  # NaN as Python writes it
            headers = {**AUTH, "content-type": "application/json"}
            return await c.request(method, path, content=content, headers=headers)

    return asyncio.run(go())


def _good(trainer: Trainer, sid: str, **changes: Any) -> dict[str, Any]:
    body = delivery(sid, prompt=trainer.ledger.group(0).prompt).model_dump(mode="json")
    body.update(changes)
    return body


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"tokens": [4, 5000]}, "g0-s0: token id 5000 is outside the model's vocabulary (1024)"),
        ({"prompt": [7, 7, 7]}, "g0-s0: the prompt is not the one admitted for group 0"),
    ],
)
def test_a_delivery_the_model_cannot_take_is_refused_and_the_sample_stays_in_flight(
    trainer: Trainer, change: dict[str, Any], says: str
) -> None:
    prompt = change.get("prompt", trainer.ledger.group(0).prompt)
    bad = delivery("g0-s0", prompt=prompt, tokens=change.get("tokens", (4, 5)))
    r = _call(trainer, "POST", "/v1/trajectories", bad.model_dump(mode="json"))
    assert r.status_code == 422 and r.json() == {"error": says, "reason": "invalid_delivery"}
    assert trainer.ledger.sample("g0-s0").state == "fresh"
    assert trainer.ledger.arrivals() == {"invalid": 1}


def test_a_positive_logprob_or_a_huge_attempt_is_refused(trainer: Trainer) -> None:
    body = _good(trainer, "g0-s0")
    body["turns"][0]["logprobs"] = [1e308, -1.0]
    r = _call(trainer, "POST", "/v1/trajectories", body)
    assert r.status_code == 422 and "logprobs" in r.json()["error"]
    record = {"attempt": 2**63, "state": "placed", "worker": "w"}
    r = _call(trainer, "POST", "/v1/samples/g0-s0/record", record)
    assert r.status_code == 422 and r.json()["error"].startswith("attempt:")
    assert trainer.ledger.sample("g0-s0").state == "fresh"


def test_nan_logprobs_or_a_nan_finish_time_are_refused_naming_the_field(trainer: Trainer) -> None:
    body = _good(trainer, "g0-s0")
    body["turns"][0]["logprobs"] = [float("nan"), -1.0]
    r = _call(trainer, "POST", "/v1/trajectories", body)
    assert r.status_code == 422 and r.json()["error"].startswith("turns.0.logprobs.0:")
    r = _call(
        trainer, "POST", "/v1/trajectories", _good(trainer, "g0-s0", finished_at=float("nan"))
    )
    assert r.status_code == 422 and r.json()["error"].startswith("finished_at:")
    assert trainer.ledger.sample("g0-s0").state == "fresh"


def _chokes_on_poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's scoring raises on any sequence holding POISON (as an out-of-range
    gather or a NaN would in a real update), wherever the trainer calls it."""
    real = grpo.token_logprobs

    def scoring(model: Any, ids: list[int], temperature: float) -> torch.Tensor:
        if POISON in ids:
            raise IndexError("index out of range in self")
        return real(model, ids, temperature)

    monkeypatch.setattr(grpo, "token_logprobs", scoring)
    monkeypatch.setattr(trainer_module, "token_logprobs", scoring)


def test_a_sample_that_fails_at_update_time_is_masked_and_training_goes_on(
    trainer: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chokes_on_poison(monkeypatch)
    prompt = trainer.ledger.group(0).prompt
    trainer.ingest(delivery("g0-s0", prompt=prompt, tokens=(4, POISON)))
    trainer.ingest(delivery("g0-s1", prompt=prompt, tokens=(4, 5)))
    stats = trainer.train_next()
    assert stats is not None and stats.masked == 1
    assert trainer.ledger.version == 1 and trainer.broken is None
    failed = {s.id: s.failed for s in trainer.ledger.samples()}
    assert failed == {"g0-s0": True, "g0-s1": False}
    assert _call(trainer, "GET", "/healthz").status_code == 200


def test_an_update_that_cannot_be_made_fails_the_trainers_health(
    trainer: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(trainer_module, "update", broken)
    prompt = trainer.ledger.group(0).prompt
    for i in range(2):
        trainer.ingest(delivery(f"g0-s{i}", prompt=prompt))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        trainer.train_next()
    health = _call(trainer, "GET", "/healthz")
    assert health.status_code == 503 and health.json()["reason"] == "cannot_train"
    assert "update 0 failed: RuntimeError('CUDA out of memory')" in health.json()["error"]
    assert trainer.ledger.version == 0  # nothing published, nothing consumed
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_sample_requeued_too_often_ends_failed_and_its_batch_trains(trainer: Trainer) -> None:
    for _ in range(MAX_REQUEUES - 1):
        r = _call(trainer, "POST", "/v1/samples/g0-s0/requeue")
        assert r.status_code == 200 and trainer.ledger.sample("g0-s0").state == "fresh"
    _call(trainer, "POST", "/v1/samples/g0-s0/requeue")
    ended = trainer.ledger.sample("g0-s0")
    assert (ended.state, ended.failed) == ("delivered", True)
    trainer.ingest(delivery("g0-s1", prompt=trainer.ledger.group(0).prompt))
    stats = trainer.train_next()
    assert stats is not None and stats.masked == 1 and trainer.ledger.version == 1


def test_unknown_samples_and_batches_are_404(trainer: Trainer) -> None:
    record = {"attempt": 1, "state": "placed", "worker": "w0", "version": 0}
    assert _call(trainer, "POST", "/v1/samples/g9-s9/record", record).status_code == 404
    many = {"records": [{"id": "g9-s9", **record}]}
    assert _call(trainer, "POST", "/v1/samples/record", many).status_code == 404
    assert _call(trainer, "POST", "/v1/samples/g9-s9/requeue").status_code == 404
    for u in (-1, 2):
        r = _call(trainer, "GET", f"/v1/batches/{u}")
        assert r.status_code == 404 and r.json()["error"] == "batches are 0 to 1"


def test_requeues_for_lost_workers_never_end_a_sample(trainer: Trainer) -> None:
    """Chaos kills workers: their samples are re-queued as often as it takes (a soak
    ended 191 of 1,280 samples failed while lost workers counted toward the cap)."""
    for _ in range(3 * MAX_REQUEUES):
        r = _call(trainer, "POST", "/v1/samples/g0-s0/requeue", {"fault": "worker"})
        assert r.status_code == 200
    assert trainer.ledger.sample("g0-s0").state == "fresh"
    r = _call(trainer, "POST", "/v1/samples/g0-s0/requeue", {"fault": "nobody's"})
    assert r.status_code == 422


def test_a_full_disk_is_503_so_the_worker_keeps_the_delivery_and_retries(
    trainer: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer, "ingest", full)
    r = _call(trainer, "POST", "/v1/trajectories", _good(trainer, "g0-s0"))
    assert r.status_code == 503 and r.json()["reason"] == "disk_full"
