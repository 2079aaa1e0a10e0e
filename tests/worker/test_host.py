"""Several workers in one process: each answers at its own prefix, and the host answers
all their states, evictions and placements in one call each (behind the token)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cadence.worker import client
from cadence.worker.api import EvictResponse, PlaceResponse
from cadence.worker.client import HostClient, WorkerError
from cadence.worker.host import create_host_app

from .factories import Pool, fresh, moved

AUTH = {"Authorization": "Bearer s3cret"}


def test_hosted_workers_answer_at_their_prefix_and_together() -> None:
    pool = Pool()
    cores = {"h800-0": pool.add("h800-0"), "a910x-0": pool.add("a910x-0")}
    asyncio.run(cores["a910x-0"].place(fresh("t", prompt=20)))

    async def calls() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        app = create_host_app(cores, "s3cret")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://host") as c:
            one = await c.get("/a910x-0/v1/state", headers=AUTH)
            both = await c.get("/v1/states", headers=AUTH)
            anonymous = await c.get("/v1/states")
        return one, both, anonymous

    one, both, anonymous = asyncio.run(calls())
    assert one.json()["worker_id"] == "a910x-0" and one.json()["kv_used_tokens"] == 20
    states = both.json()["states"]
    assert sorted(states) == ["a910x-0", "h800-0"]
    assert [r["id"] for r in states["a910x-0"]["residents"]] == ["t"]
    assert anonymous.status_code == 401


def test_bulk_place_and_evict_answer_each_item_as_its_single_call_would() -> None:
    pool = Pool()
    cores = {"h800-0": pool.add("h800-0", capacity=64), "h800-1": pool.add("h800-1")}
    asyncio.run(cores["h800-1"].place(fresh("parked", prompt=10)))
    cores["h800-1"].evict("parked")

    async def calls() -> tuple[list[object], list[object]]:
        transport = httpx.ASGITransport(app=create_host_app(cores, "s3cret"))
        host = HostClient("http://host", "s3cret", transport=transport)
        try:
            placed = await host.place(
                [
                    ("h800-0", fresh("a", prompt=20)),
                    ("h800-0", fresh("too-long", prompt=60)),  # 64 tokens of KV: no room
                    ("h800-0", moved("parked", pool.source("h800-1"), attempt=1)),
                    ("nobody", fresh("b")),
                    ("h800-1", fresh("c", version=3)),
                ]
            )
            evicted = await host.evict([("h800-0", "a"), ("h800-0", "never-placed")])
        finally:
            await host.aclose()
        return list(placed), list(evicted)

    placed, evicted = asyncio.run(calls())
    assert isinstance(placed[0], PlaceResponse) and placed[0].context == 20
    assert isinstance(placed[1], WorkerError) and placed[1].reason == "no_room"
    assert isinstance(placed[2], PlaceResponse) and placed[2].attempt == 1
    assert pool.where_resident("parked") == ["h800-0"] and "parked" not in cores["h800-1"].parked
    assert isinstance(placed[3], WorkerError) and placed[3].status == 404
    assert isinstance(placed[4], WorkerError) and placed[4].reason == "version"
    assert isinstance(evicted[0], EvictResponse) and "a" in cores["h800-0"].parked
    assert isinstance(evicted[1], WorkerError) and evicted[1].status == 404


def test_more_items_than_one_bulk_call_carries_go_in_several(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client, "BULK_ITEMS", 3)  # the API's bound is 4,096
    pool = Pool()
    cores = {"h800-0": pool.add("h800-0"), "h800-1": pool.add("h800-1")}
    calls: list[str] = []

    async def go() -> tuple[list[object], list[object]]:
        app = create_host_app(cores, "s3cret")
        transport = httpx.ASGITransport(app=app)

        async def count(request: httpx.Request) -> None:
            calls.append(request.url.path)

        host = HostClient("http://host", "s3cret", transport=transport)
        host.http.event_hooks["request"].append(count)
        try:
            ids = [f"t{i}" for i in range(7)]
            placed = await host.place([(f"h800-{i % 2}", fresh(t)) for i, t in enumerate(ids)])
            evicted = await host.evict([(f"h800-{i % 2}", t) for i, t in enumerate(ids)])
        finally:
            await host.aclose()
        return list(placed), list(evicted)

    placed, evicted = asyncio.run(go())
    assert [p.id for p in placed if isinstance(p, PlaceResponse)] == [f"t{i}" for i in range(7)]
    assert [e.id for e in evicted if isinstance(e, EvictResponse)] == [f"t{i}" for i in range(7)]
    assert calls == ["/v1/place"] * 3 + ["/v1/evict"] * 3
