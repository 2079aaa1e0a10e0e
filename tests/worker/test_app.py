"""The worker's HTTP API end to end over ASGI: auth, validation, refusals, a hand-off
between two workers through their endpoints, and metrics."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from cadence.common.sources import Destinations
from cadence.common.web import MAX_BODY_BYTES
from cadence.worker.api import Source
from cadence.worker.app import create_app
from cadence.worker.client import Peers, WorkerClient, WorkerError
from cadence.worker.core import WorkerCore
from cadence.worker.emulated import EmulatedEngine
from cadence.worker.held import Identity

from .factories import CountingSource, FakeClock, deployment, fresh, moved

TOKEN = "s3cret"


class Router(httpx.AsyncBaseTransport):
    """Sends each request to the app named by its host, as a cluster's DNS would."""

    def __init__(self) -> None:
        self.apps: dict[str, httpx.ASGITransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.apps[request.url.host].handle_async_request(request)


def _worker(router: Router, wid: str, clock: FakeClock) -> WorkerCore:
    peers = Peers(TOKEN, router, Destinations(hosts=router.apps.keys()))
    engine = EmulatedEngine(deployment(capacity=100_000), CountingSource(), clock=clock)
    core = WorkerCore(Identity(wid, "H800", 2), engine, clock, peers.claim, peers.release, 0)
    router.apps[wid] = httpx.ASGITransport(app=create_app(core, TOKEN, run_decode_loop=False))
    return core


def _client(router: Router, wid: str, token: str = TOKEN) -> WorkerClient:
    return WorkerClient(f"http://{wid}", token, transport=router)


def test_a_trajectory_hands_off_between_workers_through_their_endpoints() -> None:
    router, clock = Router(), FakeClock()
    a, b = _worker(router, "a", clock), _worker(router, "b", clock)

    async def go() -> None:
        ca, cb = _client(router, "a"), _client(router, "b")
        await ca.place(fresh("t"))
        for _ in range(5):
            await a.step()
        evicted = await ca.evict("t")
        assert evicted.model_dump() == {"id": "t", "attempt": 0, "version": 0, "context": 21}
        placed = await cb.place(moved("t", a_source, attempt=1))
        assert placed.context == 21
        state_a, state_b = await ca.state(), await cb.state()
        assert state_a.parked == [] and [r.id for r in state_b.residents] == ["t"]
        await ca.aclose()
        await cb.aclose()

    a_source = Source(worker_id="a", url="http://a")
    asyncio.run(go())
    assert "t" in b.resident and "t" not in a.parked


@pytest.mark.parametrize(("token", "status"), [("", 401), ("wrong", 401)])
def test_control_endpoints_need_the_token(token: str, status: int) -> None:
    router = Router()
    _worker(router, "a", FakeClock())

    async def go() -> WorkerError:
        client = _client(router, "a", token=token)
        with pytest.raises(WorkerError) as e:
            await client.state()
        await client.aclose()
        return e.value

    error = asyncio.run(go())
    assert (error.status, error.reason) == (status, "unauthorised")


def _raw(router: Router, method: str, path: str, **kw: object) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=router, base_url="http://a") as http:
            return await http.request(method, path, **kw)  # type: ignore[arg-type]

    return asyncio.run(go())


def test_bad_bodies_get_4xx_with_a_sentence() -> None:
    router = Router()
    _worker(router, "a", FakeClock())
    auth = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    r = _raw(router, "POST", "/v1/trajectories", content=b"{not json", headers=auth)
    assert r.status_code == 422 and r.json()["reason"] == "invalid"
    body = {"id": "t", "attempt": 0, "version": 0}  # neither fresh nor source
    r = _raw(router, "POST", "/v1/trajectories", content=json.dumps(body), headers=auth)
    assert r.status_code == 422 and "exactly one of" in r.json()["error"]
    r = _raw(router, "POST", "/v1/trajectories", content=b"x" * (MAX_BODY_BYTES + 1), headers=auth)
    assert r.status_code == 413 and r.json()["reason"] == "too_large"


def test_wrong_version_is_409_and_unknown_trajectory_is_404() -> None:
    router = Router()
    _worker(router, "a", FakeClock())

    async def go() -> list[tuple[int, str]]:
        client = _client(router, "a")
        out = []
        for call in (client.place(fresh("t", version=3)), client.evict("nope")):
            with pytest.raises(WorkerError) as e:
                await call
            out.append((e.value.status, e.value.reason))
        await client.aclose()
        return out

    assert asyncio.run(go()) == [(409, "version"), (404, "not_resident")]


def test_metrics_and_probes_are_open() -> None:
    router = Router()
    a = _worker(router, "a", FakeClock())
    asyncio.run(a.place(fresh("t", prompt=30)))
    r = _raw(router, "GET", "/metrics")
    assert r.status_code == 200
    assert (
        'cadence_worker_kv_used_tokens{accelerator="H800",engine="emulated",worker="a"} 30.0'
        in r.text
    )
    assert (
        'cadence_worker_placements_total{accelerator="H800",engine="emulated",worker="a"} 1.0'
        in r.text
    )
    version = 'cadence_worker_version{accelerator="H800",engine="emulated",worker="a"} 0.0'
    assert version in r.text  # version 0 is a version, not "none yet"
    assert _raw(router, "GET", "/healthz").status_code == 200
    assert _raw(router, "GET", "/readyz").status_code == 200
    a.drain()
    assert _raw(router, "GET", "/readyz").status_code == 503


def test_a_refusal_quotes_a_long_id_clipped() -> None:
    router = Router()
    _worker(router, "a", FakeClock())
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = _raw(router, "POST", f"/v1/trajectories/{'x' * 10_000}/evict", headers=auth)
    assert r.status_code == 404 and len(r.json()["error"]) <= 400


def test_a_body_that_repeats_a_key_is_refused_naming_it() -> None:
    """Two parsers could read `{"attempt": 0, "attempt": 5}` two ways; it is refused."""
    router = Router()
    core = _worker(router, "a", FakeClock())
    auth = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    body = '{"id": "t", "attempt": 0, "version": 0, "attempt": 5, "fresh": ' + (
        '{"prompt_token_ids": [1, 2], "max_tokens": 4}}'
    )
    r = _raw(router, "POST", "/v1/trajectories", content=body, headers=auth)
    assert r.status_code == 422 and "duplicate key 'attempt'" in r.json()["error"]
    assert core.resident == {}
