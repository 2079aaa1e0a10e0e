"""Worker API bench: `GET /v1/state` latency on loopback while the worker decodes.

One emulated worker (tokens from a tiny local Llama, paced as an H800 serving Qwen3-8B)
is served by uvicorn on 127.0.0.1; `residents` trajectories are placed through the API
and keep decoding while the bench reads the state `requests` times, one at a time.
Prints one JSON object (target: p99 at most 5 ms with 256 residents).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import uvicorn

from cadence.common import web
from cadence.common.catalog import ACCELERATORS, MODELS
from cadence.common.physics import deploy
from cadence.worker.api import FreshStart, PlaceRequest, Sampling
from cadence.worker.app import create_app
from cadence.worker.client import Peers, WorkerClient
from cadence.worker.core import WorkerCore
from cadence.worker.emulated import EmulatedEngine
from cadence.worker.engine import MonotonicClock
from cadence.worker.held import Identity
from cadence.worker.tinymodel import make_tiny_llama
from cadence.worker.torchsource import TorchTokenSource


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _bench(model_path: Path, residents: int, requests: int) -> dict[str, object]:
    token = secrets.token_hex(16)
    clock = MonotonicClock()
    deployment = deploy(MODELS["Qwen3-8B"], ACCELERATORS["H800"], 65_536)
    engine = EmulatedEngine(deployment, TorchTokenSource(model_path), clock=clock)
    peers = Peers(token)
    core = WorkerCore(Identity("bench-0", "H800", 2), engine, clock, peers.claim, peers.release, 0)
    config = uvicorn.Config(create_app(core, token), host="127.0.0.1", port=0, log_level="error")
    server = web.EmbeddedServer(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    client = WorkerClient(f"http://127.0.0.1:{port}", token)
    for i in range(residents):
        start = FreshStart(
            prompt_token_ids=[1 + (i + j) % 900 for j in range(64)],
            max_tokens=100_000,
            sampling=Sampling(temperature=1.0, seed=i),
        )
        await client.place(PlaceRequest(id=f"t{i}", attempt=0, version=0, fresh=start))
    await client.state()  # warm the connection
    latencies = []
    for _ in range(requests):
        t0 = time.perf_counter()
        state = await client.state()
        latencies.append((time.perf_counter() - t0) * 1000.0)
    await client.aclose()
    server.should_exit = True
    await serving
    return {
        "bench": "worker-api",
        "residents": len(state.residents),
        "requests": requests,
        "state_ms_p50": round(statistics.median(latencies), 3),
        "state_ms_p99": round(_quantile(latencies, 0.99), 3),
        "engine_steps": engine.pacer.steps,
        "fell_behind": state.fell_behind,
    }


def main(residents: int, requests: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        # Positions for the residents' 100,000-token budgets: a worker refuses more.
        model_path = make_tiny_llama(Path(tmp) / "tiny", max_positions=2**17)
        out = asyncio.run(_bench(model_path, residents, requests))
    print(json.dumps(out))
    return out
