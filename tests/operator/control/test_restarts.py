"""Failures mid-run: the trainer process killed (SIGKILL) and started again on its state
directory, the control loop stopped and replaced by a new one, a worker killed and
declared lost. In each the run finishes with every admitted sample consumed exactly
once, each batch trained once into its version, as the ledger shows."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from cadence.operator.control.config import LoopConfig
from cadence.operator.control.loop import ControlLoop
from cadence.operator.local.processes import (
    CADENCE,
    Workers,
    free_port,
    wait_healthy,
    worker_processes,
)
from cadence.scheduler.cadence import CadencePolicy
from cadence.scheduler.snapshot import Knobs
from cadence.trainer.client import TrainerClient
from cadence.trainer.ledger import Ledger
from tests.helpers import eventually_async

# Each test starts a trainer and two workers and trains a run end to end.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOKEN = "s3cret"
ITERATIONS, GROUP, B = 6, 4, 4
RUN_S = 300  # a whole run, on a loaded machine


class Run:
    """A trainer process on a fixed port, two emulated workers, and loops on demand."""

    def __init__(self, tmp: Path, model: Path) -> None:
        self.tmp = tmp
        self.model = model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.trainer: subprocess.Popen[bytes] | None = None

    def start_trainer(self) -> None:
        cmd = [
            *CADENCE,
            "trainer",
            *("--model-path", str(self.model), "--state-dir", str(self.tmp / "state")),
            *("--port", str(self.port), "--iterations", str(ITERATIONS), "--eta", "1"),
            *("--group-size", str(GROUP), "--batch-groups", str(B)),
        ]
        log = (self.tmp / "trainer.log").open("ab")
        env = {**os.environ, "CADENCE_TOKEN": TOKEN}
        self.trainer = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_healthy([self.url], [self.trainer], within_s=120)

    def kill_trainer(self) -> None:
        assert self.trainer is not None
        self.trainer.send_signal(signal.SIGKILL)
        self.trainer.wait()

    def loop(self, workers: dict[str, str], lost_after_s: float = 10.0) -> ControlLoop:
        knobs = Knobs(h_min=256, delta=16, eta=1, min_decode=4)
        client = TrainerClient(self.url, TOKEN, timeout_s=2.0)
        config = LoopConfig(knobs=knobs, period_s=0.1, lost_after_s=lost_after_s)
        return ControlLoop(CadencePolicy(), config, client, workers, TOKEN)


@pytest.fixture
def run(tmp_path: Path, tiny_model: Path) -> Iterator[tuple[Run, Workers]]:
    r = Run(tmp_path, tiny_model)
    r.start_trainer()
    args = ["--model-path", str(r.model), "--trainer-url", r.url]
    try:
        with worker_processes(
            ["w0", "w1"],
            lambda wid: [*args, "--weights-dir", str(tmp_path / wid), "--affinity", wid[1]],
            env={"CADENCE_TOKEN": TOKEN},
            within_s=120,
            logs=tmp_path,
        ) as workers:
            yield r, workers
    finally:
        if r.trainer is not None and r.trainer.poll() is None:
            r.kill_trainer()


async def _mid_run(r: Run) -> None:
    await eventually_async(
        _consumed_at_least(r, 2), timeout_s=RUN_S, what="2 batches consumed (mid-run)"
    )


def _consumed_at_least(r: Run, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        client = TrainerClient(r.url, TOKEN, timeout_s=2.0)
        try:
            return (await client.stats()).consumed >= n
        except Exception:
            return False  # the trainer is down: not done
        finally:
            await client.aclose()

    return check


def _ledger_shows_every_sample_once(r: Run) -> None:
    assert r.trainer is not None
    r.kill_trainer()
    ledger = Ledger(r.tmp / "state" / "ledger.db", group_size=GROUP, batch_groups=B)
    assert [v for v, _ in ledger.updates()] == list(range(1, ITERATIONS + 1))
    assert ledger.counts() == {"consumed": ITERATIONS * B * GROUP, "failed": 0}
    assert set(ledger.lag_counts()) <= {0, 1}
    assert ledger.version == ITERATIONS


def test_a_trainer_killed_mid_run_resumes_from_its_ledger(run: tuple[Run, Workers]) -> None:
    r, workers = run

    async def scenario() -> None:
        loop = r.loop(workers)
        turns = 0  # the loop's turns: each asks whether the run is done
        finished = _consumed_at_least(r, ITERATIONS)

        async def done() -> bool:
            nonlocal turns
            turns += 1
            return await finished()

        task = asyncio.create_task(loop.run(done))
        await _mid_run(r)
        r.kill_trainer()  # mid-run: deliveries now wait in the workers' outboxes
        down = turns

        async def outlived() -> bool:  # the loop went on without its trainer
            return turns >= down + 10

        await eventually_async(outlived, timeout_s=60, what="10 loop turns with the trainer down")
        r.start_trainer()
        await asyncio.wait_for(task, timeout=RUN_S)
        await loop.aclose()

    asyncio.run(scenario())
    _ledger_shows_every_sample_once(r)


def test_a_control_loop_replaced_mid_run_rebuilds_its_view(run: tuple[Run, Workers]) -> None:
    r, workers = run

    thresholds = gc.get_threshold()

    async def scenario() -> None:
        first = r.loop(workers)
        task = asyncio.create_task(first.run(_consumed_at_least(r, ITERATIONS)))
        await _mid_run(r)
        task.cancel()  # wherever it is, even between recording a placement and making it
        with pytest.raises(asyncio.CancelledError):
            await task
        await first.aclose()
        # A loop collects the oldest generation itself while it runs (idle_gc.py); a
        # cancelled one gives the process its thresholds back.
        assert gc.get_threshold() == thresholds
        second = r.loop(workers)
        await asyncio.wait_for(second.run(_consumed_at_least(r, ITERATIONS)), timeout=RUN_S)
        await second.aclose()

    asyncio.run(scenario())
    _ledger_shows_every_sample_once(r)


def test_a_worker_killed_mid_run_is_lost_and_its_samples_requeued(
    run: tuple[Run, Workers],
) -> None:
    r, workers = run

    async def scenario() -> str:
        loop = r.loop(workers, lost_after_s=1.0)
        task = asyncio.create_task(loop.run(_consumed_at_least(r, ITERATIONS)))
        await _mid_run(r)
        workers.processes["w1"].send_signal(signal.SIGKILL)  # with whatever it held
        await asyncio.wait_for(task, timeout=RUN_S)
        await loop.aclose()
        registry = CollectorRegistry()
        registry.register(loop.collector())
        return generate_latest(registry).decode()

    metrics = asyncio.run(scenario())
    assert "cadence_loop_lost_workers 1.0" in metrics
    _ledger_shows_every_sample_once(r)
