"""The worker's HTTP service: each endpoint of API v1 mapped onto `WorkerCore`.

Every control endpoint needs the bearer token (from a file or an environment variable,
as a Kubernetes Secret gives it); `/metrics`, `/healthz` and `/readyz` are open. Bodies
are validated by the models in `api.py`; an oversized body is refused before it is
parsed (413), a malformed one gets 422, and every refusal is a `Problem` with one
sentence in it. The decode loop runs as a background task for the app's lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from fastapi import FastAPI, Response
from fastapi.responses import FileResponse, JSONResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cadence.common import web
from cadence.worker.api import (
    AdvanceRequest,
    ClaimRequest,
    EvictResponse,
    FenceRequest,
    FenceResponse,
    PlaceRequest,
    PlaceResponse,
    ReleaseRequest,
    TrajectoryState,
    WorkerState,
)
from cadence.worker.core import WorkerCore
from cadence.worker.held import Refused

log = logging.getLogger("cadence.worker")


class _CoreCollector(Collector):
    """Prometheus metrics read from the core at scrape time, so they are never stale."""

    def __init__(self, core: WorkerCore) -> None:
        self.core = core

    def collect(self) -> Iterable[Metric]:
        core, engine = self.core, self.core.engine
        labels = ["worker", "accelerator", "engine"]
        values = [core.identity.worker_id, core.identity.accelerator, engine.kind]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"cadence_worker_{name}", doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"cadence_worker_{name}", doc, labels=labels)
            c.add_metric(values, value)
            return c

        used = engine.used_tokens()
        yield gauge("residents", "Trajectories resident (decoding).", len(core.resident))
        yield gauge("parked", "Departed trajectories parked in host memory.", len(core.parked))
        yield gauge("kv_used_tokens", "KV cache in use, tokens.", used)
        yield gauge("kv_capacity_tokens", "KV cache capacity, tokens.", engine.capacity_tokens)
        yield gauge("headroom_tokens", "KV capacity minus use.", engine.capacity_tokens - used)
        yield gauge(
            "version",
            "Policy version served (-1: none yet).",
            -1 if core.version is None else core.version,
        )
        yield gauge("fell_behind", "1 if the emulated pace was missed.", engine.fell_behind)
        yield counter("decoded_tokens", "Tokens decoded.", engine.decoded_tokens)
        yield gauge("tokens_per_second", "Decode throughput over the last 10 s.", core.throughput())
        yield counter("preemptions", "Residents preempted for lack of KV.", engine.preemptions)
        yield counter("placements", "Trajectories placed here.", core.counts["placements"])
        yield counter("departures", "Trajectories departed from here.", core.counts["departures"])
        yield counter("finished", "Trajectories finished here.", core.counts["finished"])
        yield counter("failed", "Samples ended failed (environment).", core.counts["failed"])
        yield counter("step_failures", "Engine steps that raised.", core.counts["step_failures"])
        yield counter(
            "tool_calls", "Tool calls sent to the environment.", core.counts["tool_calls"]
        )


async def decode_forever(core: WorkerCore, retry_s: float = 0.2) -> None:
    """Step while anything is resident, deliver, acknowledge hand-offs. A step that
    raises fails its residents (`WorkerCore.fail_step`) and the loop goes on; if the
    loop itself dies, the worker says so in `broken` and its health probe fails."""
    try:
        await _decode(core, retry_s)
    except asyncio.CancelledError:
        raise
    except BaseException as e:
        core.broken = f"the decode loop stopped: {e!r}"
        log.exception("worker %s: the decode loop stopped", core.identity.worker_id)
        raise


async def _decode(core: WorkerCore, retry_s: float) -> None:
    while True:
        if core.hold_decoding:
            await asyncio.sleep(0.05)
            continue
        if core.resident:
            try:
                await core.step()
            except Exception as e:
                core.fail_step(e)
            await asyncio.sleep(0)  # let requests in between steps
            continue
        if core.outbox is not None and core.outbox.queue:
            await core.outbox.flush()
            await asyncio.sleep(retry_s)
            continue
        if core.unreleased:  # hand-offs whose acknowledgement failed
            await core.retry_releases()
            await asyncio.sleep(retry_s)
            continue
        core.engine.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(core.engine.wake.wait(), timeout=1.0)


def create_app(core: WorkerCore, token: str, *, run_decode_loop: bool = True) -> FastAPI:
    lifespan = web.background((lambda: decode_forever(core)) if run_decode_loop else None)
    app = FastAPI(title="Cadence rollout worker", version="v1", lifespan=lifespan)
    registry = CollectorRegistry()
    registry.register(_CoreCollector(core))

    guarded = web.install(app, token, refusals=(Refused,))

    @app.get("/v1/state", dependencies=guarded)
    async def state() -> WorkerState:
        return core.state()

    @app.post("/v1/trajectories", dependencies=guarded)
    async def place(body: PlaceRequest) -> PlaceResponse:
        return await core.place(body)

    @app.post("/v1/trajectories/{rid}/evict", dependencies=guarded)
    async def evict(rid: str) -> EvictResponse:
        return core.evict(rid)

    @app.post("/v1/parked/{rid}/claim", dependencies=guarded)
    async def claim(rid: str, body: ClaimRequest) -> TrajectoryState:
        return await core.claim(rid, body)

    @app.post("/v1/parked/{rid}/release", dependencies=guarded, status_code=204)
    async def release(rid: str, body: ReleaseRequest) -> None:
        core.release(rid, body)

    @app.post("/v1/fence", dependencies=guarded)
    async def fence(body: FenceRequest) -> FenceResponse:
        return FenceResponse(dropped=core.fence(body.items))

    @app.post("/v1/advance", dependencies=guarded)
    async def advance(body: AdvanceRequest) -> WorkerState:
        return await core.advance(body)

    @app.get("/v1/weights/{version}", dependencies=guarded)
    async def weights(version: int) -> FileResponse:
        return FileResponse(core.weights_file(version), media_type="application/octet-stream")

    @app.post("/v1/drain", dependencies=guarded)
    async def drain() -> list[EvictResponse]:
        return core.drain()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        if core.broken is not None:
            return web.problem(503, "broken", core.broken)
        if (stalled := core.stalled()) is not None:
            return web.problem(503, "stalled", stalled)
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        if core.broken is not None:
            return web.problem(503, "broken", core.broken)
        if (stalled := core.stalled()) is not None:
            return web.problem(503, "stalled", stalled)
        if core.draining:
            return web.problem(503, "draining", "the worker is draining")
        return JSONResponse({"status": "ready"})

    return app
