"""Finished trajectories reach the trainer exactly once each, through outages."""

from __future__ import annotations

import asyncio

import pytest

from cadence.worker.api import Delivery, Timings
from cadence.worker.held import Refused
from cadence.worker.outbox import Outbox, Rejected

from .factories import FakeClock, Pool, fresh


class FakeTrainer:
    """Accepts deliveries while up; records every key it accepted."""

    def __init__(self) -> None:
        self.up = True
        self.keys: list[str] = []

    async def __call__(self, delivery: Delivery) -> None:
        if not self.up:
            raise ConnectionError("the trainer is away")
        self.keys.append(delivery.key)


def test_an_outage_loses_nothing_delivers_nothing_twice_and_backs_up_placement() -> None:
    clock = FakeClock()
    pool = Pool(clock)
    worker = pool.add("a")
    trainer = FakeTrainer()
    worker.outbox = Outbox(trainer, clock, capacity=3)

    async def finish_all() -> None:
        while worker.resident:
            await worker.step()

    trainer.up = False
    for i in range(3):
        asyncio.run(worker.place(fresh(f"t{i}", max_tokens=4 + i)))
    asyncio.run(finish_all())
    assert trainer.keys == [] and len(worker.outbox.queue) == 3
    with pytest.raises(Refused) as e:
        asyncio.run(worker.place(fresh("late")))
    assert (e.value.status, e.value.reason) == (503, "outbox_full")

    asyncio.run(worker.outbox.flush())  # still away, and within the backoff: nothing goes
    assert worker.outbox.failures >= 1 and trainer.keys == []
    trainer.up = True
    asyncio.run(worker.outbox.flush())  # before the backoff ends: waits
    assert trainer.keys == []
    clock.work(60.0)
    assert asyncio.run(worker.outbox.flush()) == 3
    assert trainer.keys == ["t0:0", "t1:0", "t2:0"]
    asyncio.run(worker.place(fresh("late")))  # room again
    asyncio.run(finish_all())
    assert trainer.keys == ["t0:0", "t1:0", "t2:0", "late:0"]


def test_backoff_doubles_up_to_its_ceiling() -> None:
    clock = FakeClock()
    trainer = FakeTrainer()
    trainer.up = False
    box = Outbox(trainer, clock, backoff_s=1.0, max_backoff_s=4.0)
    box.put(
        Delivery(
            id="t",
            attempt=0,
            version=0,
            worker_id="a",
            prompt_token_ids=[1],
            turns=[],
            timings=Timings(),
            finished_at=0.0,
        )
    )
    waits = []
    for _ in range(5):
        before = clock.now()
        asyncio.run(box.flush())
        waits.append(box._retry_at - before)
        clock.t = box._retry_at
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_delivery_the_trainer_refuses_for_good_is_dropped_not_retried_ahead_of_the_rest() -> None:
    """A stale or invalid delivery used to be retried for ever at the head of the queue,
    so nothing behind it reached the trainer again."""
    clock = FakeClock()
    accepted: list[str] = []

    async def trainer(delivery: Delivery) -> None:
        if delivery.id == "stale":
            raise Rejected("409 attempt 0 of stale is not current")
        accepted.append(delivery.id)

    outbox = Outbox(trainer, clock)
    for rid in ("stale", "next"):
        outbox.put(
            Delivery(
                id=rid,
                attempt=0,
                version=0,
                worker_id="a",
                prompt_token_ids=[1],
                turns=[],
                timings=Timings(),
                finished_at=0.0,
            )
        )
    assert asyncio.run(outbox.flush()) == 1
    assert accepted == ["next"] and not outbox.queue and outbox.rejected == 1
