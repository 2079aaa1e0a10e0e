"""Emulation bench: how closely emulated workers keep their accelerators' pace in wall
time when several share one host.

`workers` emulated engines (half H800, half A910X, serving the catalog's Qwen3-8B, time
compressed by `compression`) run in one process, as `cadence run` runs a pool, each
decoding `residents` trajectories with tokens from its own tiny local Llama. Each
engine's pacer knows the modelled time of every step it scheduled; `pace` is that
modelled time over the wall time it took (1.0: kept pace; below 1.0: the host could not
produce tokens fast enough and the engine reported it fell behind).
`compression_that_keeps_pace` estimates the largest compression at which the slowest
worker would have kept pace (compression x its pace); run again at it to check. Torch
runs one thread per step here: eight engines stepping at once oversubscribe the cores
otherwise. Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import torch

from cadence.common.catalog import ACCELERATORS, MODELS
from cadence.common.physics import deploy
from cadence.worker.api import Sampling
from cadence.worker.emulated import EmulatedEngine
from cadence.worker.engine import EngineRequest, MonotonicClock
from cadence.worker.tinymodel import make_tiny_llama
from cadence.worker.torchsource import TorchTokenSource

ACCELERATOR_MIX = ("H800", "A910X")


async def _run(
    model_path: Path, workers: int, residents: int, seconds: float, compression: float
) -> dict[str, object]:
    torch.set_num_threads(1)
    clock = MonotonicClock()
    engines = []
    for w in range(workers):
        accelerator = ACCELERATOR_MIX[w % len(ACCELERATOR_MIX)]
        deployment = deploy(MODELS["Qwen3-8B"], ACCELERATORS[accelerator], 65_536)
        engine = EmulatedEngine(
            deployment, TorchTokenSource(model_path), clock=clock, compression=compression
        )
        for i in range(residents):
            prompt = [1 + (w * 131 + i * 7 + j) % 900 for j in range(64)]
            sampling = Sampling(temperature=1.0, seed=w * 10_000 + i)
            engine.add(EngineRequest(f"w{w}-t{i}", prompt, 100_000, sampling))
        engines.append((accelerator, engine))

    async def decode(engine: EmulatedEngine, until: float) -> float:
        start = time.monotonic()
        while time.monotonic() < until:
            await engine.step()
        return time.monotonic() - start

    t0 = time.monotonic()
    walls = await asyncio.gather(*(decode(e, t0 + seconds) for _, e in engines))
    per_worker = []
    for (accelerator, engine), wall in zip(engines, walls, strict=True):
        pacer = engine.pacer
        per_worker.append(
            {
                "accelerator": accelerator,
                "steps": pacer.steps,
                "modelled_step_ms": round(1000 * pacer.scheduled_total_s / max(1, pacer.steps), 3),
                "pace": round(pacer.scheduled_total_s / wall, 3),
                "late_steps": pacer.late_steps,
                "lag_s": round(pacer.lag_s, 3),
                "tokens_per_s": round(engine.decoded_tokens / wall, 1),
                "fell_behind": engine.fell_behind,
            }
        )
    paces = [float(str(w["pace"])) for w in per_worker]
    return {
        "bench": "emulation",
        "workers": workers,
        "residents_per_worker": residents,
        "compression": compression,
        "seconds": seconds,
        "pace_min": min(paces),
        "pace_mean": round(sum(paces) / len(paces), 3),
        "compression_that_keeps_pace": round(compression * min(paces), 4),
        "host_tokens_per_s": round(sum(float(str(w["tokens_per_s"])) for w in per_worker), 1),
        "any_fell_behind": any(bool(w["fell_behind"]) for w in per_worker),
        "per_worker": per_worker,
    }


def main(workers: int, residents: int, seconds: float, compression: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        model_path = make_tiny_llama(Path(tmp) / "tiny")
        result = asyncio.run(_run(model_path, workers, residents, seconds, compression))
    print(json.dumps(result))
    return result
