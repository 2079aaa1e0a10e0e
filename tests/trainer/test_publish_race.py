"""An external trainer's publish is one step: of two publishers racing with different
weights for the same version, the one acknowledged is the one served, on disk and in
the trainer's model, every time."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load, load_file, save_file

from cadence.common.tensors import weights_of
from cadence.trainer.app import create_app
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer

from .factories import delivery

AUTH = {"Authorization": "Bearer s3cret"}
PAIRS = 100


def _same(these: dict[str, torch.Tensor], those: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(these[k].float(), those[k].float()) for k in those)


def _weights(tiny_model: Path, folder: Path, name: str, seed: int) -> tuple[str, str]:
    """A perturbed copy of the tiny model's weights: (its path, its sha256)."""
    torch.manual_seed(seed)
    tensors = load_file(tiny_model / "model.safetensors")
    path = folder / f"{name}.safetensors"
    save_file({k: v + 0.01 * torch.randn(v.shape).to(v.dtype) for k, v in tensors.items()}, path)
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(600)
def test_of_two_racing_publishers_the_acknowledged_one_is_served(
    tiny_model: Path, tmp_path: Path
) -> None:
    weights = tmp_path / "published"
    weights.mkdir()
    a = _weights(tiny_model, weights, "a", 1)
    b = _weights(tiny_model, weights, "b", 2)
    config = TrainerConfig(
        model_path=tiny_model,
        state_dir=tmp_path / "state",
        task="external",
        group_size=2,
        batch_groups=1,
        iterations=PAIRS,
        eta=0,
        publish_from=weights,
    )
    trainer = Trainer(config)
    tensors = {a[0]: load_file(a[0]), b[0]: load_file(b[0])}

    async def race() -> list[tuple[int, str]]:
        transport = httpx.ASGITransport(app=create_app(trainer, "s3cret", train=False))
        winners = []
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            prompts = {"prompts": [{"prompt_token_ids": [1, 2, g + 3]} for g in range(PAIRS)]}
            assert (await c.post("/v1/prompts", json=prompts, headers=AUTH)).status_code == 200
            for u in range(PAIRS):
                assert (await c.post("/v1/admit", json={"groups": 1}, headers=AUTH)).json() == {
                    "groups": [u]
                }
                for sid in (f"g{u}-s0", f"g{u}-s1"):
                    record = {"attempt": 1, "state": "placed", "worker": "w0", "version": u}
                    await c.post(f"/v1/samples/{sid}/record", json=record, headers=AUTH)
                    done = delivery(sid, attempt=1, version=u, prompt=[1, 2, u + 3])
                    sent = done.model_dump(mode="json")
                    assert (await c.post("/v1/trajectories", json=sent, headers=AUTH)).is_success
                first, second = (a, b) if u % 2 else (b, a)
                answers = await asyncio.gather(
                    *(
                        c.post(
                            "/v1/publish",
                            json={"version": u + 1, "weights_uri": uri, "sha256": digest},
                            headers=AUTH,
                        )
                        for uri, digest in (first, second)
                    )
                )
                codes = sorted(r.status_code for r in answers)
                assert codes == [200, 409], [r.text for r in answers]
                winner = (first, second)[[r.status_code for r in answers].index(200)]
                served = (await c.get("/v1/version")).json()
                assert served["version"] == u + 1
                body = (await c.get(served["weights_path"], headers=AUTH)).content
                assert hashlib.sha256(body).hexdigest() == served["sha256"]
                assert _same(load(body), tensors[winner[0]])
                winners.append((u + 1, winner[0]))
        return winners

    try:
        winners = asyncio.run(race())
        # The trainer's own model holds the last acknowledged weights, not the refused ones.
        assert _same(weights_of(trainer.model), tensors[winners[-1][1]])
    finally:
        trainer.ledger.close()
