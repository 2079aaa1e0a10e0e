"""The trainer's HTTP service: ingest from workers, the ledger for the control loop,
published weights for workers, and a background task that trains each batch as soon as
it is complete (in a thread, so ingest keeps answering while torch works).

Every endpoint but `/metrics`, `/healthz` and the weights' sha256 list needs the bearer
token; refusals are one sentence (`common/web.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Response
from fastapi.responses import FileResponse, JSONResponse
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cadence.common import web
from cadence.common.sources import SourceRefused, WeightsSource
from cadence.common.statelock import StateLost
from cadence.common.stats import percentile
from cadence.trainer.api import (
    AdmitRequest,
    AdmitResponse,
    Batch,
    BatchSample,
    Ended,
    EndedPage,
    EndedTurn,
    IngestResponse,
    LedgerView,
    PromptQueue,
    PublishRequest,
    RecordMany,
    RecordRequest,
    RequeueRequest,
    RequeueResponse,
    RunSettings,
    RunStats,
    SubmitRequest,
    VersionInfo,
)
from cadence.trainer.ledger import IN_FLIGHT, LedgerError, UnknownSample
from cadence.trainer.trainer import Trainer
from cadence.worker.api import Delivery

SQLITE_MAX = 2**63 - 1  # the largest integer a ledger's query takes

log = logging.getLogger("cadence.trainer")


class _TrainerCollector(Collector):
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def collect(self) -> Iterable[Metric]:
        ledger = self.trainer.ledger
        g = GaugeMetricFamily("cadence_trainer_version", "Newest published version.")
        g.add_metric([], ledger.version)
        yield g
        c = CounterMetricFamily("cadence_trainer_batches", "Batches trained.")
        c.add_metric([], ledger.consumed_batches)
        yield c
        s = GaugeMetricFamily("cadence_trainer_samples", "Samples by state.", labels=["state"])
        for state, n in ledger.counts().items():
            s.add_metric([state], n)
        yield s


async def _train_forever(trainer: Trainer, retry_s: float = 5.0) -> None:
    """Train each batch as it completes. An update that fails is logged and tried again
    after `retry_s` (the trainer's health says why meanwhile); the task never dies."""
    while True:
        if trainer.ready():
            try:
                stats = await asyncio.to_thread(trainer.train_next)
            except Exception:
                log.exception("training batch %d failed", trainer.ledger.consumed_batches)
                trainer.broken = trainer.broken or "training failed; see the trainer's log"
                await asyncio.sleep(retry_s)
                continue
            trainer.broken = None
            if stats is not None:
                log.info("published version %d: %s", trainer.ledger.version, stats)
            continue
        await asyncio.sleep(0.05)


def _rollout_routes(trainer: Trainer, guarded: Any, route_class: type[APIRoute]) -> APIRouter:
    """What workers and the control loop call: deliveries, the ledger, admission, where
    each sample is, re-queues."""
    router = APIRouter(route_class=route_class)
    config = trainer.config

    @router.post("/v1/trajectories", dependencies=guarded)
    async def ingest(body: Delivery) -> IngestResponse:
        result, reward, why = trainer.ingest(body)
        if result == "invalid":
            raise web.Refusal(422, "invalid_delivery", why)
        if result == "unknown":
            raise web.Refusal(404, "unknown", f"sample {body.id} was never admitted")
        if result == "stale":
            raise web.Refusal(
                409, "stale_attempt", f"attempt {body.attempt} of {body.id} is not current"
            )
        return IngestResponse(result=result, reward=reward)

    @router.get("/v1/ledger", dependencies=guarded, response_model=LedgerView)
    async def ledger(since: str | None = None) -> Response:
        """Serialized here, once: the control loop reads it every period, and FastAPI
        would validate every sample's entry again before serializing it. With `since`
        (an earlier answer's `<epoch>.<rev>`), only what changed after it."""
        after = _since(since)
        with trainer.lock:
            ledger = trainer.ledger
            epoch, rev = ledger.epoch, ledger.rev
            delta = after is not None and after[0] == epoch and after[1] <= rev
            if after is not None and delta:
                rows = ledger.changed_since(after[1])
            else:
                rows = ledger.listed("fresh", *IN_FLIGHT)
            fresh = [r for r in rows if r[3] == "fresh"]
            groups = sorted({group for _, group, *_ in fresh})
            # Validated whole, from plain rows: one model per sample costs twice as much.
            view = LedgerView.model_validate(
                {
                    "version": ledger.version,
                    "cursor": ledger.cursor,
                    "consumed": ledger.consumed_batches,
                    "total_groups": trainer.total_groups,
                    "group_size": config.group_size,
                    "batch_groups": config.batch_groups,
                    "admission_limit": trainer.admission_limit(),
                    "prompts": {g: ledger.group(g).prompt for g in groups},
                    "fresh": [{"id": i, "group": g, "attempt": a} for i, g, a, *_ in fresh],
                    "in_flight": [
                        {"id": i, "group": g, "attempt": a, "state": s, "worker": w, "version": v}
                        for i, g, a, s, w, v in rows
                        if s in IN_FLIGHT
                    ],
                    "ended": [i for i, _, _, s, *_ in rows if s != "fresh" and s not in IN_FLIGHT],
                    "max_tokens": config.max_tokens,
                    "temperature": config.temperature,
                    "epoch": epoch,
                    "rev": rev,
                    "delta": delta,
                }
            )
        return Response(view.model_dump_json(), media_type="application/json")

    @router.get("/v1/ended", dependencies=guarded)
    async def ended(
        after: int = Query(-1, ge=-1, le=SQLITE_MAX), limit: int = Query(1000, ge=1, le=10_000)
    ) -> EndedPage:
        """The accepted deliveries after `after`, by their sizes and times: what a run
        trace records of each trajectory."""
        with trainer.lock:
            rows = trainer.ledger.ended_after(after, limit)
        items = [_ended(*row) for row in rows]
        return EndedPage(items=items, last=items[-1].seq if items else after)

    @router.post("/v1/admit", dependencies=guarded)
    async def admit(body: AdmitRequest) -> AdmitResponse:
        return AdmitResponse(groups=[g.index for g in trainer.admit(body.groups)])

    @router.post("/v1/samples/{sid}/record", dependencies=guarded)
    async def record(sid: str, body: RecordRequest) -> dict[str, bool]:
        with trainer.lock:
            try:
                taken = trainer.ledger.record(
                    sid, body.attempt, body.state, worker=body.worker, version=body.version
                )
            except UnknownSample as e:
                raise web.Refusal(404, "unknown", str(e)) from None
            except LedgerError as e:
                raise web.Refusal(422, "invalid", str(e)) from None
        return {"recorded": taken}

    @router.post("/v1/samples/record", dependencies=guarded)
    async def record_many(body: RecordMany) -> dict[str, int]:
        rows = [(r.id, r.attempt, r.state, r.worker, r.version) for r in body.records]
        with trainer.lock:
            try:
                return {"recorded": trainer.ledger.record_many(rows)}
            except UnknownSample as e:
                raise web.Refusal(404, "unknown", str(e)) from None
            except LedgerError as e:
                raise web.Refusal(422, "invalid", str(e)) from None

    @router.post("/v1/samples/{sid}/requeue", dependencies=guarded)
    async def requeue(sid: str, body: RequeueRequest | None = None) -> RequeueResponse:
        charged = body is None or body.fault == "sample"
        with trainer.lock:
            try:
                attempt = trainer.ledger.requeue(sid, time.time(), charged=charged)
                return RequeueResponse(attempt=attempt)
            except UnknownSample as e:
                raise web.Refusal(404, "unknown", str(e)) from None
            except LedgerError as e:
                raise web.Refusal(409, "finished", str(e)) from None

    return router


def _update_seconds(updates: list[tuple[int, str]]) -> dict[int, float]:
    out = {}
    for version, stats in updates:
        seconds = json.loads(stats).get("seconds")
        if isinstance(seconds, int | float):
            out[version] = float(seconds)
    return out


def _ended(seq: int, batch: int, group: int, latency_s: float | None, raw: str) -> Ended:
    d = Delivery.model_validate_json(raw)
    return Ended(
        seq=seq,
        id=d.id,
        batch=batch,
        group=group,
        attempt=d.attempt,
        worker=d.worker_id,
        prompt_tokens=len(d.prompt_token_ids),
        turns=[
            EndedTurn(role=t.role, tokens=len(t.token_ids), version=t.version, seconds=t.seconds)
            for t in d.turns
        ],
        failed=d.failed,
        latency_s=latency_s,
        finished_at=d.finished_at,
    )


def _since(since: str | None) -> tuple[str, int] | None:
    if since is None:
        return None
    epoch, dot, rev = since.rpartition(".")
    if not dot or not epoch or not rev.isdigit():
        raise web.Refusal(
            400, "invalid_since", f"since {since!r} is not an earlier answer's <epoch>.<rev>"
        )
    return epoch, int(rev)


def _weights_routes(trainer: Trainer, guarded: Any, route_class: type[APIRoute]) -> APIRouter:
    """Published versions and their weights, for workers advancing."""
    router = APIRouter(route_class=route_class)

    @router.get("/v1/version")
    async def version() -> VersionInfo:
        v = trainer.ledger.version
        await asyncio.to_thread(trainer.published, v)
        return VersionInfo(
            version=v, sha256=trainer.store.sha256(v), weights_path=f"/v1/weights/{v}"
        )

    @router.get("/v1/versions/{v}")
    async def version_of(v: int) -> VersionInfo:
        if not await asyncio.to_thread(trainer.published, v):
            raise web.Refusal(404, "no_weights", f"version {v} is not kept")
        return VersionInfo(
            version=v, sha256=trainer.store.sha256(v), weights_path=f"/v1/weights/{v}"
        )

    @router.get("/v1/weights/{v}", dependencies=guarded)
    async def weights(v: int) -> FileResponse:
        if not await asyncio.to_thread(trainer.published, v):
            raise web.Refusal(404, "no_weights", f"version {v} is not kept")
        return FileResponse(trainer.store.path(v), media_type="application/octet-stream")

    return router


def _external_routes(trainer: Trainer, guarded: Any, route_class: type[APIRoute]) -> APIRouter:
    """What an external trainer calls: read the run's settings, submit prompts, take whole
    batches, publish versions."""
    router = APIRouter(route_class=route_class)
    config = trainer.config

    @router.get("/v1/settings", dependencies=guarded)
    async def settings() -> RunSettings:
        return RunSettings(
            task=config.task,
            group_size=config.group_size,
            batch_groups=config.batch_groups,
            iterations=config.iterations,
            eta=config.eta,
            max_tokens=config.max_tokens,
            temperature=config.temperature,
        )

    @router.post("/v1/prompts", dependencies=guarded)
    async def submit(body: SubmitRequest) -> PromptQueue:
        if not trainer.external:
            raise web.Refusal(409, "not_external", "this trainer draws prompts from its task")
        prompts = [
            (p.prompt_token_ids or trainer.vocabulary.encode(p.text or ""), p.answer)
            for p in body.prompts
        ]
        with trainer.lock:
            try:
                queued = trainer.ledger.submit(prompts, body.first)
            except LedgerError as e:
                raise web.Refusal(409, "gap", str(e)) from None
            return PromptQueue(queued=queued, admitted=trainer.ledger.cursor)

    @router.get("/v1/prompts", dependencies=guarded)
    async def prompt_queue() -> PromptQueue:
        with trainer.lock:
            return PromptQueue(queued=trainer.ledger.queued(), admitted=trainer.ledger.cursor)

    @router.get("/v1/batches/{u}", dependencies=guarded)
    async def batch(u: int) -> Batch:
        if not 0 <= u < config.iterations:
            raise web.Refusal(404, "no_batch", f"batches are 0 to {config.iterations - 1}")
        with trainer.lock:
            if trainer.ledger.consumed_batches <= u and not trainer.complete(u):
                raise web.Refusal(409, "incomplete", f"batch {u} is not complete yet")
            samples = [
                BatchSample(id=s.id, group=s.group, version=d.version, failed=d.failed, delivery=d)
                for s, d in trainer.ledger.deliveries(u)
            ]
        return Batch(batch=u, samples=samples)

    @router.post("/v1/publish", dependencies=guarded)
    async def publish(body: PublishRequest) -> VersionInfo:
        if not trainer.external:
            raise web.Refusal(409, "not_external", "this trainer publishes its own versions")
        source = WeightsSource(None, directory=config.publish_from)
        try:
            data = await source.read(body.weights_uri)
        except SourceRefused as e:
            raise web.Refusal(403, "weights_source", str(e)) from None
        except Exception as e:
            raise web.Refusal(502, "fetch", f"cannot fetch {body.weights_uri}: {e}") from None
        try:
            await asyncio.to_thread(trainer.publish_external, body.version, data, body.sha256)
        except LedgerError as e:
            raise web.Refusal(409, "publish", str(e)) from None
        v = body.version
        return VersionInfo(
            version=v, sha256=trainer.store.sha256(v), weights_path=f"/v1/weights/{v}"
        )

    return router


def _status_routes(
    trainer: Trainer, guarded: Any, route_class: type[APIRoute], registry: CollectorRegistry
) -> APIRouter:
    """The run's figures, metrics and health."""
    router = APIRouter(route_class=route_class)
    config = trainer.config

    @router.get("/v1/stats", dependencies=guarded)
    async def stats() -> RunStats:
        with trainer.lock:
            ledger = trainer.ledger
            accepted = ledger.accepted_arrivals()
            latencies = sorted(lat for _, _, lat in accepted if lat is not None)
            return RunStats(
                version=ledger.version,
                consumed=ledger.consumed_batches,
                iterations=config.iterations,
                counts=ledger.counts(),
                # An external trainer scores its own samples: the run knows no reward.
                reward_by_version={} if trainer.external else ledger.reward_by_version(),
                done=ledger.consumed_batches >= config.iterations,
                tokens_delivered=sum(t for _, t, _ in accepted),
                latency_p50_s=percentile(latencies, 0.5),
                latency_p95_s=percentile(latencies, 0.95),
                arrivals=ledger.arrivals(),
                accepted_twice=ledger.accepted_twice(),
                update_seconds=_update_seconds(ledger.updates()),
            )

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @router.get("/healthz")
    async def healthz() -> JSONResponse:
        try:
            trainer.state_lock.check()
        except StateLost as e:
            return web.problem(503, e.reason, str(e))
        if trainer.broken is not None:
            return web.problem(503, "cannot_train", trainer.broken)
        return JSONResponse({"status": "ok"})

    return router


def create_app(trainer: Trainer, token: str, *, train: bool = True) -> FastAPI:
    lifespan = web.background((lambda: _train_forever(trainer)) if train else None)
    app = FastAPI(title="Cadence trainer", version="v1", lifespan=lifespan)
    guarded = web.install(app, token, refusals=(StateLost,))
    registry = CollectorRegistry()
    registry.register(_TrainerCollector(trainer))
    route_class = app.router.route_class
    app.include_router(_rollout_routes(trainer, guarded, route_class))
    app.include_router(_weights_routes(trainer, guarded, route_class))
    app.include_router(_external_routes(trainer, guarded, route_class))
    app.include_router(_status_routes(trainer, guarded, route_class, registry))
    return app
