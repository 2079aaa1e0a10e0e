"""A Cadence run for an external trainer, on this machine: the trainer service in
external-trainer mode, emulated workers and the control loop, in a thread of their own.

What TRL (or any trainer driving the pool through `cadence.trainer.client`) connects to
when it trains on one machine: its prompts go in through the service, whole batches come
out, the versions it publishes are what the workers advance to. The run ends when its
last batch's update is published, or when the caller leaves the context."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cadence.operator.control.config import LoopConfig
from cadence.operator.control.loop import ControlLoop
from cadence.operator.local.processes import serve_trainer, worker_processes
from cadence.scheduler.cadence import CadencePolicy
from cadence.scheduler.snapshot import Knobs
from cadence.trainer.client import TrainerClient
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer


@dataclass(frozen=True)
class ExternalRun:
    """Where the external trainer reaches the run, and the run's trainer (its ledger)."""

    url: str
    token: str
    trainer: Trainer


@contextlib.contextmanager
def external_run(
    config: TrainerConfig,
    *,
    token: str,
    workers: int = 2,
    logs: Path | None = None,
    start_within_s: float = 300.0,
) -> Iterator[ExternalRun]:
    """The run of `config` (its task `external`) with `workers` emulated workers; yields
    once its service answers and its workers are up."""
    if config.task != "external":
        raise ValueError(f"the run's task is {config.task}: an external run needs external")
    trainer = Trainer(config)
    found: list[str] = []
    failed: list[BaseException] = []
    started, stop = threading.Event(), threading.Event()
    ids = [f"w{i}" for i in range(workers)]
    weights = config.state_dir / "workers"

    async def main() -> None:
        async with serve_trainer(trainer, token) as url:
            args = ["--model-path", str(config.model_path), "--trainer-url", url]
            with worker_processes(
                ids,
                lambda wid: [*args, "--weights-dir", str(weights / wid)],
                env={"CADENCE_TOKEN": token},
                within_s=start_within_s,
                logs=logs,
            ) as urls:
                client = TrainerClient(url, token)
                knobs = Knobs(h_min=256, delta=16, eta=config.eta, min_decode=4)
                loop = ControlLoop(
                    CadencePolicy(), LoopConfig(knobs=knobs, period_s=0.1), client, urls, token
                )

                async def done() -> bool:
                    return stop.is_set() or (await client.stats()).done

                found.append(url)
                started.set()
                try:
                    await loop.run(done)
                finally:
                    await loop.aclose()
                    await client.aclose()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as e:
            failed.append(e)
        finally:
            started.set()

    thread = threading.Thread(target=run, name="cadence-external-run", daemon=True)
    thread.start()
    started.wait(timeout=start_within_s)
    if failed:
        raise failed[0]
    if not found:
        raise TimeoutError(f"the run did not start within {start_within_s:.0f} s")
    try:
        yield ExternalRun(found[0], token, trainer)
    finally:
        stop.set()
        thread.join(timeout=120)
    if failed:
        raise failed[0]
