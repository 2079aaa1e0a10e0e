"""An external trainer's dataset of any size reaches the run: `submit_all` sends it in
chunks that fit one request, numbered so that a retry queues nothing twice, and keeps
no more than a window of prompts queued ahead of admission."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cadence.common.web import MAX_BODY_BYTES
from cadence.trainer.api import SubmittedPrompt
from cadence.trainer.app import create_app
from cadence.trainer.client import TrainerClient, TrainerError
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer

TOKEN = "s3cret"


def _external(model: Path, state: Path, *, batch_groups: int, iterations: int) -> Trainer:
    return Trainer(
        TrainerConfig(
            model_path=model,
            state_dir=state,
            task="external",
            group_size=2,
            batch_groups=batch_groups,
            iterations=iterations,
            eta=1_000,  # admission runs far ahead: these tests train nothing
        )
    )


def _client(trainer: Trainer) -> TrainerClient:
    transport = httpx.ASGITransport(app=create_app(trainer, TOKEN, train=False))
    return TrainerClient("http://t", TOKEN, transport=transport, timeout_s=60)


def _prompts(n: int, tokens: int) -> Iterator[SubmittedPrompt]:
    for i in range(n):
        yield SubmittedPrompt(prompt_token_ids=[1 + (i + k) % 900 for k in range(tokens)])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_dataset_past_one_requests_limits_is_queued_whole_and_in_order(
    tiny_model: Path, tmp_path: Path
) -> None:
    many = 200_000  # twice the 100,000 prompts one request takes
    trainer = _external(tiny_model, tmp_path / "many", batch_groups=200, iterations=1_000)
    wide = _external(tiny_model, tmp_path / "wide", batch_groups=3, iterations=1_000)
    long = 1_000  # 3,000 prompts of 1,000 token ids: past the 8 MiB body limit
    assert 3_000 * long * 4 > MAX_BODY_BYTES

    async def go() -> tuple[int, int]:
        client, other = _client(trainer), _client(wide)
        try:
            return (
                await client.submit_all(_prompts(many, 4)),
                await other.submit_all(_prompts(3_000, long)),
            )
        finally:
            await client.aclose()
            await other.aclose()

    try:
        assert asyncio.run(go()) == (many, 3_000)
        assert trainer.ledger.queued() == many
        assert trainer.ledger.submitted(many - 1) == (
            [1 + (many - 1 + k) % 900 for k in range(4)],
            "",
        )
        assert wide.ledger.submitted(2_999) == ([1 + (2_999 + k) % 900 for k in range(long)], "")
    finally:
        trainer.ledger.close()
        wide.ledger.close()


def test_a_chunk_sent_again_queues_nothing_twice_and_a_gap_is_refused(
    tiny_model: Path, tmp_path: Path
) -> None:
    trainer = _external(tiny_model, tmp_path, batch_groups=2, iterations=10)

    async def go() -> None:
        client = _client(trainer)
        try:
            chunk = list(_prompts(5, 3))
            assert await client.submit(chunk, first=0) == 5
            assert await client.submit(chunk, first=0) == 5  # a retry
            assert await client.submit(chunk, first=3) == 8  # two of its five were there
            with pytest.raises(TrainerError, match="leaves a gap") as refused:
                await client.submit(chunk, first=9)
            assert refused.value.status == 409
        finally:
            await client.aclose()

    try:
        asyncio.run(go())
        assert trainer.ledger.queued() == 8
        assert trainer.ledger.submitted(5) == ([3, 4, 5], "")  # prompt 2 of the second send
    finally:
        trainer.ledger.close()


def test_no_more_than_the_window_waits_ahead_of_admission(tiny_model: Path, tmp_path: Path) -> None:
    trainer = _external(tiny_model, tmp_path, batch_groups=10, iterations=50)
    window, chunk = 50, 20
    waiting: list[int] = []

    async def go() -> int:
        client = _client(trainer)
        admitted = 0

        async def admit() -> None:
            nonlocal admitted
            while admitted < 500:
                q = await client.prompt_queue()
                waiting.append(q.queued - q.admitted)
                admitted += len(await client.admit(10))
                await asyncio.sleep(0)

        try:
            sending = asyncio.create_task(
                client.submit_all(
                    _prompts(500, 3), window=window, poll_s=0.001, chunk_prompts=chunk
                )
            )
            await admit()
            return await sending
        finally:
            await client.aclose()

    try:
        assert asyncio.run(go()) == 500
        assert trainer.ledger.cursor == 500
        assert max(waiting) <= window + chunk
    finally:
        trainer.ledger.close()
