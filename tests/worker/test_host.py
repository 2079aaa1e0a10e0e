"""Several workers in one process: each answers at its own prefix, and the host answers
all their states in one call (behind the token)."""

from __future__ import annotations

import asyncio

import httpx

from cadence.worker.host import create_host_app

from .factories import Pool, fresh

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
