"""A run's figures cover the whole run: `requeued` and `cycles` count every cycle, not the
control loop's last 1,000 reports (a tester's run printed 128 re-queued where the ledger
held 640), and the cycle-time percentiles are taken over a sample of every cycle.

The loop runs real cycles against a stand-in trainer (httpx's MockTransport) whose ledger
shows, every cycle, one sample in flight that no worker holds: each cycle re-queues it."""

from __future__ import annotations

import asyncio

import httpx

from cadence.common.stats import percentile
from cadence.operator.control.config import LoopConfig
from cadence.operator.local.figures import LedgerFigures, Reservoir, RunLoop, measures
from cadence.scheduler.cadence import CadencePolicy
from cadence.scheduler.snapshot import Knobs
from cadence.trainer.api import RunStats
from cadence.trainer.client import TrainerClient

CYCLES = 1_200  # more than the loop keeps reports of
KNOBS = Knobs(h_min=64, delta=16, eta=1)


class Trainer:
    """A ledger with one orphaned sample in flight, and the re-queues it was asked for."""

    def __init__(self) -> None:
        self.requeues = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/ledger":
            orphan = {
                "id": "0-0",
                "group": 0,
                "attempt": self.requeues,
                "state": "placed",
                "worker": None,
                "version": 0,
            }
            return httpx.Response(200, json=_ledger(orphan))
        if request.url.path == "/v1/samples/0-0/requeue":
            self.requeues += 1
            return httpx.Response(200, json={"attempt": self.requeues})
        return httpx.Response(404, json={"error": "not here", "reason": "http"})


def _ledger(in_flight: dict[str, object]) -> dict[str, object]:
    return {
        "version": 0,
        "cursor": 1,
        "consumed": 0,
        "total_groups": 1,
        "group_size": 1,
        "batch_groups": 1,
        "admission_limit": 1,
        "prompts": {},
        "fresh": [],
        "in_flight": [in_flight],
        "max_tokens": 8,
        "temperature": 1.0,
    }


def test_requeued_and_cycles_count_the_whole_run() -> None:
    trainer = Trainer()

    async def go() -> RunLoop:
        client = TrainerClient("http://trainer", "t", transport=httpx.MockTransport(trainer))
        config = LoopConfig(knobs=KNOBS, period_s=0.0)
        loop = RunLoop(CadencePolicy(), config, client, {}, "t")
        asked = 0

        async def done() -> bool:
            nonlocal asked
            asked += 1
            return asked > CYCLES

        await loop.run(done)
        await client.aclose()
        return loop

    loop = asyncio.run(go())
    stats = RunStats(
        version=0, consumed=0, iterations=1, counts={}, reward_by_version={}, done=True
    )
    figures = measures(stats, loop, [], 1.0, "cadence")
    assert trainer.requeues == CYCLES
    assert figures["requeued"] == CYCLES and figures["cycles"] == CYCLES
    assert len(loop.sample.items) == CYCLES and loop.sample.seen == CYCLES


def test_cycle_percentiles_sample_every_cycle_in_bounded_memory() -> None:
    sample: Reservoir[float] = Reservoir(1_000, seed=0)
    for i in range(20_000):  # slow first, fast for the last 1,000
        sample.add(100.0 if i < 19_000 else 1.0)
    assert len(sample.items) == 1_000 and sample.seen == 20_000
    assert percentile(sample.items, 0.5) == 100.0  # the last 1,000 alone say 1.0
    assert 20 <= sample.items.count(1.0) <= 80  # about 1 in 20, as in the run


def test_samples_lost_and_accepted_twice_are_the_ledgers() -> None:
    stats = RunStats(
        version=3,
        consumed=3,
        iterations=3,
        counts={"consumed": 100},  # what the trainer said last
        reward_by_version={},
        done=True,
    )
    loop = RunLoop(
        CadencePolicy(), LoopConfig(knobs=KNOBS), TrainerClient("http://t", "t"), {}, "t"
    )
    ledger = LedgerFigures(admitted=192, ended=190, failed=1, accepted_twice=1)
    figures = measures(stats, loop, [], 1.0, "cadence", ledger=ledger)
    assert figures["samples_admitted"] == 192 and figures["samples_delivered"] == 190
    assert figures["samples_lost"] == 2 and figures["samples_duplicated"] == 1
    assert figures["samples_failed"] == 1
