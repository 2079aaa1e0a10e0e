"""No single input stops a worker (issue 19): what the engine cannot decode is refused at
the API as vLLM refuses it; a step that fails anyway fails its residents (dropped, so
the control loop re-queues them) and the worker goes on; an engine that keeps failing,
or a decode loop that dies, fails the health probes so the pod is restarted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from cadence.worker.api import FreshStart, PlaceRequest, Sampling, Source
from cadence.worker.app import create_app, decode_forever
from cadence.worker.client import Peers
from cadence.worker.core import MAX_STEP_FAILURES, WorkerCore
from cadence.worker.emulated import EmulatedEngine, Sampled
from cadence.worker.engine import EngineRequest
from cadence.worker.held import Identity, Refused
from cadence.worker.torchsource import TorchTokenSource
from tests.helpers import eventually_async

from .factories import CountingSource, FakeClock, deployment, fresh, moved

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class FailingSource(CountingSource):
    """Raises on any step that decodes a request whose prompt starts with `poison`
    (`always`: on every step)."""

    def __init__(self, poison: int = 666, *, always: bool = False) -> None:
        self.poison, self.always = poison, always

    def next_tokens(self, batch: Sequence[EngineRequest]) -> list[Sampled]:
        if self.always or any(r.context_ids[0] == self.poison for r in batch):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().next_tokens(batch)


def _poisoned(rid: str) -> PlaceRequest:
    start = FreshStart(prompt_token_ids=[666, 1, 2], max_tokens=40)
    return PlaceRequest(id=rid, attempt=0, version=0, fresh=start)


def _core(source: Any, clock: FakeClock | None = None) -> WorkerCore:
    clock = clock or FakeClock()
    engine = EmulatedEngine(deployment(capacity=100_000), source, clock=clock)
    peers = Peers(TOKEN)
    return WorkerCore(Identity("w", "H800", 2), engine, clock, peers.claim, peers.release, 0)


def _post(app: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as http:
            # json.dumps writes NaN as Python does, as a careless client would send it
            content = json.dumps(body)
            headers = {**AUTH, "content-type": "application/json"}
            return await http.post(path, content=content, headers=headers)

    return asyncio.run(go())


def _body(request: PlaceRequest, **fresh_changes: Any) -> dict[str, Any]:
    body = request.model_dump(mode="json")
    body["fresh"].update(fresh_changes)
    return body


def test_a_prompt_token_outside_the_vocabulary_is_refused_and_the_worker_goes_on(
    tiny_model: Path,
) -> None:
    core = _core(TorchTokenSource(tiny_model))
    app = create_app(core, TOKEN, run_decode_loop=False)
    refused = _post(app, "/v1/trajectories", _body(fresh("bad"), prompt_token_ids=[1, 5000]))
    assert refused.status_code == 422
    assert refused.json()["error"] == "bad: token id 5000 is outside the model's vocabulary (1024)"
    assert not core.resident and "bad" not in core.newest_attempt

    async def decode() -> None:
        await core.place(fresh("good", max_tokens=6))
        while core.resident:
            await core.step()

    asyncio.run(decode())
    assert [s.id for s in core.finished] == ["good"] and core.finished[0].generated == 6


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sampling": {"temperature": 1e-300}}, "fresh.sampling.temperature"),
        ({"sampling": {"temperature": float("nan")}}, "fresh.sampling.temperature"),
        ({"sampling": {"seed": 2**70}}, "fresh.sampling.seed"),
        ({"prompt_token_ids": [2**40]}, "fresh.prompt_token_ids.0"),
    ],
)
def test_sampling_the_engine_cannot_honour_is_refused_naming_the_field(
    change: dict[str, Any], field: str
) -> None:
    core = _core(CountingSource())
    body = _body(fresh("t"), **change)
    r = _post(create_app(core, TOKEN, run_decode_loop=False), "/v1/trajectories", body)
    assert r.status_code == 422 and r.json()["error"].startswith(f"{field}:"), r.json()
    assert not core.resident


def test_greedy_and_ordinary_temperatures_are_taken() -> None:
    core = _core(CountingSource())
    app = create_app(core, TOKEN, run_decode_loop=False)
    for i, t in enumerate((0.0, 0.01, 1.0, 2.0)):
        body = _body(fresh(f"t{i}"), sampling=Sampling(temperature=t).model_dump())
        assert _post(app, "/v1/trajectories", body).status_code == 200
    assert len(core.resident) == 4


def test_an_attempt_beyond_64_bits_is_refused() -> None:
    core = _core(CountingSource())
    body = fresh("t").model_dump(mode="json") | {"attempt": 2**70}
    r = _post(create_app(core, TOKEN, run_decode_loop=False), "/v1/trajectories", body)
    assert r.status_code == 422 and r.json()["error"].startswith("attempt:")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"attempt": "0"}, "attempt"),  # a string is not a number
        ({"attempt": True}, "attempt"),  # nor is a boolean
        ({"attempt": 2**31}, "attempt"),  # a re-queue of it would overflow the ledger
        ({"version": "0"}, "version"),
    ],
)
def test_numbers_are_strict_json_numbers_within_bounds(change: dict[str, Any], field: str) -> None:
    core = _core(CountingSource())
    body = fresh("t").model_dump(mode="json") | change
    r = _post(create_app(core, TOKEN, run_decode_loop=False), "/v1/trajectories", body)
    assert r.status_code == 422 and r.json()["error"].startswith(f"{field}:")
    assert core.resident == {}


def test_a_refused_placement_does_not_raise_the_fence() -> None:
    """A placement refused (here: the wrong version) leaves the trajectory's fence where
    it was, so the next real attempt, lower than the refused one, still starts."""
    core = _core(CountingSource())

    async def go() -> None:
        with pytest.raises(Refused, match="version"):
            await core.place(fresh("t", attempt=2**30, version=3))
        await core.place(fresh("t", attempt=1))

    asyncio.run(go())
    assert core.resident["t"].attempt == 1


@pytest.mark.parametrize("url", ["not a url", "ftp://peer/x", "http://"])
def test_a_malformed_source_url_is_refused_at_the_api(url: str) -> None:
    core = _core(CountingSource())
    body = moved("t", Source(worker_id="p", url="http://p"), attempt=1).model_dump(mode="json")
    body["source"]["url"] = url
    r = _post(create_app(core, TOKEN, run_decode_loop=False), "/v1/trajectories", body)
    assert r.status_code == 422 and r.json()["error"].startswith("source.url:")


def test_an_unreachable_source_is_a_refused_placement_not_a_500() -> None:
    core = _core(CountingSource())
    body = moved("t", Source(worker_id="p", url="http://127.0.0.1:9"), attempt=1)
    app = create_app(core, TOKEN, run_decode_loop=False)
    r = _post(app, "/v1/trajectories", body.model_dump(mode="json"))
    assert r.status_code == 409 and r.json()["reason"] == "source_unreachable"
    assert not core.resident and "t" not in core.newest_attempt


async def _until(condition: Any, what: str) -> None:
    """Until `condition()` holds: a step runs in a thread, which 10,000 turns of the event
    loop did not always outlast when the suite ran beside other work."""

    async def check() -> bool:
        return bool(condition())

    await eventually_async(check, timeout_s=30, what=what, every_s=0.001)


def test_a_failing_step_drops_its_residents_and_the_worker_goes_on() -> None:
    """The step that decodes a poisoned trajectory raises: the residents are dropped
    (no worker holds them, so the control loop re-queues them), the failure is counted,
    the worker stays healthy, and the next trajectory decodes to its end."""
    core = _core(FailingSource())
    app = create_app(core, TOKEN, run_decode_loop=False)

    async def go() -> tuple[int, int, str]:
        loop = asyncio.create_task(decode_forever(core))
        await core.place(_poisoned("poisoned"))
        await core.place(fresh("bystander"))
        await _until(lambda: not core.resident, "the residents dropped")
        dropped = (core.counts["step_failures"], len(core.state().residents))
        await core.place(fresh("next", attempt=1, max_tokens=4))
        await _until(lambda: core.finished, "the next trajectory finished")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as http:
            health = (await http.get("/healthz")).status_code
            metrics = (await http.get("/metrics")).text
        loop.cancel()
        return *dropped, f"{health} {metrics}"

    failures, residents, seen = asyncio.run(go())
    assert failures == 1 and residents == 0
    assert [s.id for s in core.finished] == ["next"]
    assert seen.startswith("200 ") and "cadence_worker_step_failures_total{" in seen


def test_an_engine_that_keeps_failing_fails_the_health_probes() -> None:
    core = _core(FailingSource(always=True))
    app = create_app(core, TOKEN, run_decode_loop=False)

    async def go() -> tuple[int, int, int]:
        loop = asyncio.create_task(decode_forever(core))
        for i in range(MAX_STEP_FAILURES):
            await core.place(fresh(f"t{i}"))
            await _until(lambda: not core.resident, f"t{i} dropped")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as http:
            health = (await http.get("/healthz")).status_code
            ready = (await http.get("/readyz")).status_code
            placed = await http.post(
                "/v1/trajectories", json=fresh("late").model_dump(mode="json"), headers=AUTH
            )
        loop.cancel()
        return health, ready, placed.status_code

    assert asyncio.run(go()) == (503, 503, 503)
    assert core.broken is not None and "illegal memory access" in core.broken


def test_a_decode_loop_that_dies_fails_the_health_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    core = _core(CountingSource())
    app = create_app(core, TOKEN, run_decode_loop=False)

    async def broken_flush() -> None:
        raise RuntimeError("disk full")

    async def go() -> int:
        core.unreleased["x"] = (Source(worker_id="p", url="http://p"), None)  # type: ignore[assignment]
        monkeypatch.setattr(core, "retry_releases", broken_flush)
        with pytest.raises(RuntimeError, match="disk full"):
            await decode_forever(core)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as http:
            return (await http.get("/healthz")).status_code

    assert asyncio.run(go()) == 503
    assert core.broken == "the decode loop stopped: RuntimeError('disk full')"
