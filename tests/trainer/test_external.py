"""An external trainer (a custom loop standing in for verl or TRL) drives the pool through
the client: it submits prompts, receives each batch whole with versions and logprobs,
trains on it elsewhere and publishes the next version by path; the workers advance."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from cadence.operator.control.config import LoopConfig
from cadence.operator.control.loop import ControlLoop
from cadence.operator.local.processes import serve_trainer, worker_processes
from cadence.scheduler.cadence import CadencePolicy
from cadence.scheduler.snapshot import Knobs
from cadence.trainer.api import SubmittedPrompt
from cadence.trainer.client import TrainerClient
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer

TOKEN = "s3cret"


@pytest.mark.slow
def test_an_external_trainer_drives_the_pool_through_the_client(
    tmp_path: Path, tiny_model: Path
) -> None:
    model = tiny_model
    config = TrainerConfig(
        model_path=model,
        state_dir=tmp_path / "state",
        task="external",
        group_size=2,
        batch_groups=2,
        iterations=2,
        eta=0,
        publish_from=tmp_path,  # where this "external trainer" leaves its weights
    )
    trainer = Trainer(config)

    async def scenario() -> list[list[int]]:
        async with serve_trainer(trainer, TOKEN) as url:
            args = ["--model-path", str(model), "--trainer-url", url]
            with worker_processes(
                ["w0"],
                lambda wid: [*args, "--weights-dir", str(tmp_path / wid)],
                env={"CADENCE_TOKEN": TOKEN},
                within_s=120,
            ) as workers:
                client = TrainerClient(url, TOKEN)
                prompts = [
                    SubmittedPrompt(text=f"{a} + {a} =", answer=str(2 * a)) for a in range(4)
                ]
                assert await client.submit(prompts) == 4
                knobs = Knobs(h_min=256, delta=16, eta=0, min_decode=4)
                loop = ControlLoop(
                    CadencePolicy(), LoopConfig(knobs=knobs, period_s=0.1), client, workers, TOKEN
                )

                async def done() -> bool:
                    return (await client.stats()).done

                running = asyncio.create_task(loop.run(done))
                versions = []
                for u in range(2):
                    batch = await client.batch(u, timeout_s=120)
                    assert [s.group for s in batch.samples] == [2 * u, 2 * u, 2 * u + 1, 2 * u + 1]
                    for s in batch.samples:
                        model_turns = [t for t in s.delivery.turns if t.role == "model"]
                        assert all(len(t.logprobs or []) == len(t.token_ids) for t in model_turns)
                    versions.append([s.version for s in batch.samples])
                    weights = load_file(model / "model.safetensors")  # "training", elsewhere
                    update = {
                        k: v + 0.01 * torch.randn(v.shape).to(v.dtype) for k, v in weights.items()
                    }
                    path = tmp_path / f"v{u + 1}.safetensors"
                    save_file(update, path)
                    info = await client.publish(u + 1, path)
                    assert info.version == u + 1
                await asyncio.wait_for(running, timeout=120)
                await loop.aclose()
                await client.aclose()
        return versions

    versions = asyncio.run(scenario())
    assert versions == [[0, 0, 0, 0], [1, 1, 1, 1]]  # batch 1 ran on the published version
    assert trainer.ledger.counts() == {"consumed": 8, "failed": 0}
