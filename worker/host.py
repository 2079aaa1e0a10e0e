"""Several workers in one process, each mounted at `/<worker id>` on one port.

`cadence run` puts a pool of 32 emulated workers on a 2-core machine this way: a few host
processes instead of 32 interpreters. Each worker keeps its own core, engine, outbox and
API (its URL is `http://host:port/<id>`, which the control loop and peers use as any
worker's base URL); the host runs every worker's decode loop for its lifetime. The
control loop talks to a host in bulk: every worker's state in one call
(`GET /v1/states`, as progress on the last whole state where that is all that changed),
a cycle's evictions and placements in one call each
(`POST /v1/evict`, `POST /v1/place`), because on a busy host each request waits for the
decode steps, and 64 single placements cost a cycle hundreds of milliseconds. Killing
the host process loses all of its workers at once, as losing a node would.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse

from cadence.common import web
from cadence.common.problem import Problem
from cadence.worker.api import (
    HostEvictMany,
    HostPlaceMany,
    HostStates,
    Outcome,
    Outcomes,
    PlaceRequest,
    WorkerState,
)
from cadence.worker.app import create_app, decode_forever
from cadence.worker.core import WorkerCore
from cadence.worker.held import Refused
from cadence.worker.state_progress import progress_of

log = logging.getLogger("cadence.host")
T = TypeVar("T")


def create_host_app(cores: dict[str, WorkerCore], token: str) -> FastAPI:
    async def decode_all() -> None:
        await asyncio.gather(*(decode_forever(core) for core in cores.values()))

    host = FastAPI(title="Cadence worker host", version="v1", lifespan=web.background(decode_all))

    guarded = web.install(host, token)

    @host.get("/healthz")
    async def healthz() -> JSONResponse:
        broken = [f"{wid}: {core.broken}" for wid, core in cores.items() if core.broken]
        if broken:
            return web.problem(503, "broken", "; ".join(broken))
        stalled = [f"{wid}: {why}" for wid, core in cores.items() if (why := core.stalled())]
        if stalled:
            return web.problem(503, "stalled", "; ".join(stalled))
        return JSONResponse({"status": "ok", "workers": sorted(cores)})

    sent = _Sent()

    @host.get("/v1/states", dependencies=guarded, response_model=HostStates)
    async def states(since: str | None = None) -> Response:
        """Every hosted worker's `/v1/state` in one answer, as progress where it can
        (`worker/state_progress.py`). Serialized here, once: the control loop reads it every
        period, and FastAPI would validate every worker's state again."""
        now = {wid: core.state() for wid, core in cores.items()}
        answer = sent.answer(now, since)
        return Response(answer.model_dump_json(), media_type="application/json")

    @host.post("/v1/evict", dependencies=guarded)
    async def evict_many(body: HostEvictMany) -> Outcomes:
        """Each item as `POST /<worker>/v1/trajectories/{id}/evict` would answer it."""

        async def one(core: WorkerCore, rid: str) -> Outcome:
            return Outcome(evicted=core.evict(rid))

        return Outcomes(items=[await _outcome(cores, i.worker, one, i.id) for i in body.items])

    @host.post("/v1/place", dependencies=guarded)
    async def place_many(body: HostPlaceMany) -> Outcomes:
        """Each item as `POST /<worker>/v1/trajectories` would answer it, concurrently
        (a departed trajectory is claimed from its source over HTTP)."""

        async def one(core: WorkerCore, request: PlaceRequest) -> Outcome:
            return Outcome(placed=await core.place(request))

        calls = [_outcome(cores, i.worker, one, i.request) for i in body.items]
        return Outcomes(items=list(await asyncio.gather(*calls)))

    for wid, core in cores.items():
        host.mount(f"/{wid}", create_app(core, token, run_decode_loop=False))
    return host


class _Sent:
    """What this host last sent whole of each worker, and the token of its last answer:
    a reader that names that token gets progress on those states."""

    def __init__(self) -> None:
        self.session = secrets.token_hex(6)
        self.seq = 0
        self.whole: dict[str, WorkerState] = {}

    def answer(self, now: dict[str, WorkerState], since: str | None) -> HostStates:
        current = since is not None and since == f"{self.session}.{self.seq}"
        if not current:
            self.whole = {}
        whole, progress = {}, {}
        for wid, st in now.items():
            base = self.whole.get(wid)
            step = progress_of(base, st) if base is not None else None
            if step is None:
                whole[wid] = self.whole[wid] = st
            else:
                progress[wid] = step
        for wid in set(self.whole) - set(now):
            del self.whole[wid]
        self.seq += 1
        return HostStates(states=whole, progress=progress, token=f"{self.session}.{self.seq}")


async def _outcome(
    cores: dict[str, WorkerCore],
    worker: str,
    call: Callable[[WorkerCore, T], Awaitable[Outcome]],
    item: T,
) -> Outcome:
    core = cores.get(worker)
    if core is None:
        return _refused(404, "unknown_worker", f"no worker {worker} on this host")
    try:
        return await call(core, item)
    except (Refused, web.Refusal) as e:
        return _refused(e.status, e.reason, str(e))
    except Exception as e:  # one item's failure must not fail the others' answers
        log.exception("bulk item for %s failed", worker)
        return _refused(500, "internal", f"{type(e).__name__}: {e}")


def _refused(status: int, reason: str, message: str) -> Outcome:
    return Outcome(status=status, problem=Problem(error=message, reason=reason))
