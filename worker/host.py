"""Several workers in one process, each mounted at `/<worker id>` on one port.

`cadence run` puts a pool of 32 emulated workers on a 2-core machine this way: a few host
processes instead of 32 interpreters. Each worker keeps its own core, engine, outbox and
API (its URL is `http://host:port/<id>`, which the control loop and peers use as any
worker's base URL); the host runs every worker's decode loop for its lifetime and
answers every worker's state in one call (`GET /v1/states`). Killing
the host process loses all of its workers at once, as losing a node would.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from pydantic import BaseModel

from cadence.worker import web
from cadence.worker.api import WorkerState
from cadence.worker.app import create_app, decode_forever
from cadence.worker.core import WorkerCore


class HostStates(BaseModel):
    states: dict[str, WorkerState]


def create_host_app(cores: dict[str, WorkerCore], token: str) -> FastAPI:
    async def decode_all() -> None:
        await asyncio.gather(*(decode_forever(core) for core in cores.values()))

    host = FastAPI(title="Cadence worker host", version="v1", lifespan=web.background(decode_all))

    guarded = web.install(host, token)

    @host.get("/healthz")
    async def healthz() -> dict[str, object]:
        return {"status": "ok", "workers": sorted(cores)}

    @host.get("/v1/states", dependencies=guarded)
    async def states() -> HostStates:
        """Every hosted worker's `/v1/state` in one answer: the control loop reads a
        host once per cycle instead of once per worker."""
        return HostStates(states={wid: core.state() for wid, core in cores.items()})

    for wid, core in cores.items():
        host.mount(f"/{wid}", create_app(core, token, run_decode_loop=False))
    return host
