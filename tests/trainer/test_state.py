"""The trainer's state directory has one owner and is checked before it is served: a
second trainer on it is refused, and a ledger that is damaged or disagrees with the
published weights stops the start in one sentence, never version 0 beside a newer
policy. Weights deleted under a running trainer are written again from memory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from cadence.common.statelock import StateInUse, StateLost
from cadence.trainer.app import create_app
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import StateDamaged, Trainer
from cadence.trainer.weights import save_optimizer

TOKEN = "s3cret"


def _config(model: Path, state: Path) -> TrainerConfig:
    return TrainerConfig(
        model_path=model, state_dir=state, group_size=2, batch_groups=1, iterations=3, eta=1
    )


def _at_version(trainer: Trainer, version: int) -> None:
    """As if `version` updates had run: published weights and the ledger's version."""
    for v in range(1, version + 1):
        trainer.store.publish(trainer.model, v)
        save_optimizer(trainer.optimizer, trainer.model, trainer._optimizer_path(v))
    with trainer.ledger._tx():
        trainer.ledger._set("version", str(version))


def _stop(trainer: Trainer) -> None:
    trainer.ledger.close()
    trainer.state_lock.release()


def test_a_second_trainer_on_one_state_directory_is_refused(
    tiny_model: Path, tmp_path: Path
) -> None:
    first = Trainer(_config(tiny_model, tmp_path))
    with pytest.raises(StateInUse, match="is in use by another process"):
        Trainer(_config(tiny_model, tmp_path))
    _stop(first)
    Trainer(_config(tiny_model, tmp_path))  # once it is gone, the directory is free


def test_deleting_the_lock_note_leaves_the_directory_owned(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Clearing a "stale" lock file is a common habit; ownership is not in that file."""
    first = Trainer(_config(tiny_model, tmp_path))
    (tmp_path / "trainer.lock").unlink()
    with pytest.raises(StateInUse, match=r"is in use by another process \(pid unknown\)"):
        Trainer(_config(tiny_model, tmp_path))
    assert first.admit(1)  # the owner goes on writing
    _stop(first)


def test_a_directory_replaced_under_its_trainer_is_no_longer_written_by_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Renamed away and made anew, the state path names a directory a second trainer may
    own; the first refuses every write from then on and says why on /healthz."""
    state = tmp_path / "state"
    first = Trainer(_config(tiny_model, state))
    state.rename(tmp_path / "moved")
    second = Trainer(_config(tiny_model, state))
    with pytest.raises(StateLost, match="removed or replaced"):
        first.admit(1)
    with pytest.raises(StateLost):
        first.store.publish(first.model, 1)
    assert not (state / "weights" / "v1.safetensors").exists()

    async def ask(trainer: Trainer, method: str, path: str, **kw: object) -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(trainer, TOKEN, train=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.request(method, path, **kw)  # type: ignore[arg-type]

    health = asyncio.run(ask(first, "GET", "/healthz"))
    assert health.status_code == 503 and health.json()["reason"] == "state_lost"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    admit = asyncio.run(ask(first, "POST", "/v1/admit", json={"groups": 1}, headers=auth))
    assert admit.status_code == 503 and "no longer owns" in admit.json()["error"]
    assert asyncio.run(ask(second, "GET", "/healthz")).status_code == 200
    assert second.admit(1)
    _stop(second)
    first.ledger.close()


@pytest.mark.parametrize("damage", ["emptied", "missing"])
def test_a_lost_ledger_beside_newer_weights_is_refused(
    tiny_model: Path, tmp_path: Path, damage: str
) -> None:
    t = Trainer(_config(tiny_model, tmp_path))
    _at_version(t, 3)
    _stop(t)
    ledger = tmp_path / "ledger.db"
    for extra in tmp_path.glob("ledger.db-*"):
        extra.unlink()
    if damage == "emptied":
        ledger.write_bytes(b"")
    else:
        ledger.unlink()
    with pytest.raises(StateDamaged, match="at version 0 but its weights go up to version 3"):
        Trainer(_config(tiny_model, tmp_path))


def test_a_corrupt_ledger_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    _stop(Trainer(_config(tiny_model, tmp_path)))
    for extra in tmp_path.glob("ledger.db-*"):
        extra.unlink()
    (tmp_path / "ledger.db").write_bytes(b"not a database at all " * 200)
    with pytest.raises(StateDamaged, match=r"ledger .* is damaged"):
        Trainer(_config(tiny_model, tmp_path))


def test_missing_or_altered_weights_of_the_ledgers_version_are_refused(
    tiny_model: Path, tmp_path: Path
) -> None:
    t = Trainer(_config(tiny_model, tmp_path))
    _at_version(t, 2)
    _stop(t)
    weights = tmp_path / "weights" / "v2.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(StateDamaged, match="does not match its sha256"):
        Trainer(_config(tiny_model, tmp_path))
    weights.unlink()
    with pytest.raises(StateDamaged, match=r"is at version 2 but .*v2\.safetensors"):
        Trainer(_config(tiny_model, tmp_path))


def test_an_update_published_but_never_recorded_is_trained_again(
    tiny_model: Path, tmp_path: Path
) -> None:
    t = Trainer(_config(tiny_model, tmp_path))
    _at_version(t, 2)
    t.store.publish(t.model, 3)  # the update died before the ledger recorded version 3
    _stop(t)
    again = Trainer(_config(tiny_model, tmp_path))
    assert again.ledger.version == 2 and 3 not in again.store.versions()


def test_weights_deleted_under_a_running_trainer_are_written_again(
    tiny_model: Path, tmp_path: Path
) -> None:
    t = Trainer(_config(tiny_model, tmp_path))
    digest = t.store.sha256(0)
    for f in (tmp_path / "weights").iterdir():
        f.unlink()
    (tmp_path / "weights").rmdir()

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(t, TOKEN, train=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            return await http.get("/v1/version")

    answer = asyncio.run(go())
    assert answer.status_code == 200 and answer.json()["sha256"] == digest
    assert t.store.has(0)
    _stop(t)
