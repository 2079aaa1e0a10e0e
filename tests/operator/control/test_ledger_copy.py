"""The control loop's copy of the ledger, kept by changes, is the ledger: after any
sequence of admissions, placements, moves, re-queues and deliveries it equals a whole
read, while each read after the first moves only what changed."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cadence.operator.control.ledger_copy import LedgerCopy
from cadence.scheduler.fresh_index import FreshIndex
from cadence.scheduler.snapshot import FreshSample
from cadence.trainer.api import LedgerView, SampleState
from cadence.trainer.app import create_app
from cadence.trainer.client import TrainerClient, TrainerError
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer
from tests.trainer.factories import delivery

TOKEN = "s3cret"


@pytest.fixture
def trainer(tiny_model: Path, tmp_path: Path) -> Iterator[Trainer]:
    config = TrainerConfig(
        model_path=tiny_model, state_dir=tmp_path, group_size=4, batch_groups=2, iterations=50
    )
    t = Trainer(config)
    yield t
    t.ledger.close()


class _Recording(TrainerClient):
    """A trainer client that keeps every ledger answer it read."""

    answers: list[LedgerView]

    async def ledger(self, since: str | None = None) -> LedgerView:
        view = await super().ledger(since)
        self.answers.append(view)
        return view


def _client(trainer: Trainer) -> _Recording:
    transport = httpx.ASGITransport(app=create_app(trainer, TOKEN, train=False))
    client = _Recording("http://trainer", TOKEN, transport=transport)
    client.answers = []
    return client


def _same(copy: LedgerView, whole: LedgerView, index: FreshIndex | None = None) -> None:
    assert {f.id: f for f in copy.fresh} == {f.id: f for f in whole.fresh}
    assert {s.id: s for s in copy.in_flight} == {s.id: s for s in whole.in_flight}
    assert copy.prompts == whole.prompts
    assert copy.model_dump(exclude={"fresh", "in_flight", "prompts"}) == whole.model_dump(
        exclude={"fresh", "in_flight", "prompts"}
    )
    if index is not None:  # the fresh samples as the snapshot takes them, kept as they change
        samples = [FreshSample(f.id, f.group, len(whole.prompts[f.group])) for f in whole.fresh]
        scratch = FreshIndex.of(whole.batch_groups, samples)
        assert list(index.by_batch().items()) == list(scratch.by_batch().items())


def test_the_copy_equals_a_whole_read_after_every_change(trainer: Trainer) -> None:
    rng = random.Random(7)

    async def go() -> None:
        client, whole = _client(trainer), _client(trainer)
        copy = LedgerCopy(client)
        _same(await copy.read(), await whole.ledger())
        for _ in range(120):
            fresh = trainer.ledger.samples("fresh")
            going = trainer.ledger.samples("placed", "parked", "environment")
            op = rng.choice(["admit", "place", "place", "move", "requeue", "deliver"])
            if op == "admit" or not (fresh or going):
                trainer.admit(rng.randint(1, 2))
            elif op == "place" and fresh:
                s = rng.choice(fresh)
                trainer.ledger.record(s.id, s.attempt + 1, "placed", worker=f"w{rng.randint(0, 3)}")
            elif op == "move" and going:
                s = rng.choice(going)
                state: SampleState = rng.choice(["parked", "environment", "placed"])
                trainer.ledger.record(s.id, s.attempt, state, worker=f"w{rng.randint(0, 3)}")
            elif op == "requeue" and going:
                trainer.ledger.requeue(rng.choice(going).id, charged=False)
            elif op == "deliver" and going:
                s = rng.choice(going)
                prompt = trainer.ledger.group(s.group).prompt
                trainer.ingest(delivery(s.id, attempt=s.attempt, prompt=prompt))
            _same(await copy.read(), await whole.ledger(), copy.index)
        answers = client.answers
        assert not answers[0].delta and all(a.delta for a in answers[1:])
        changed = sum(len(a.fresh) + len(a.in_flight) + len(a.ended) for a in answers[1:])
        listed = sum(len(a.fresh) + len(a.in_flight) for a in whole.answers[1:])
        assert changed < listed / 4

    asyncio.run(go())


def test_a_new_ledger_or_a_bad_since_is_answered_whole_or_refused(trainer: Trainer) -> None:
    async def go() -> None:
        client = _client(trainer)
        trainer.admit(2)
        first = await client.ledger()
        trainer.admit(1)
        assert (await client.ledger(first.since)).delta
        assert len((await client.ledger(first.since)).fresh) == 4  # the group admitted since
        for other in (f"other.{first.rev}", f"{first.epoch}.{first.rev + 100}"):
            answer = await client.ledger(other)
            assert not answer.delta and len(answer.fresh) == 12
        with pytest.raises(TrainerError) as refused:
            await client.ledger("yesterday")
        assert refused.value.status == 400 and "since" in str(refused.value)

    asyncio.run(go())
