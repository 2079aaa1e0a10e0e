"""Calls that race on one worker: each ends one way. A replayed placement is fenced like
any stale attempt; concurrent identical moves start the trajectory once; one advance at
a time, and no placement while it fetches and loads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cadence.worker.api import AdvanceRequest, TrajectoryState
from cadence.worker.held import Refused

from .factories import Pool, fresh, moved


def test_a_replayed_fresh_placement_of_an_evicted_trajectory_is_refused() -> None:
    a = Pool().add("a")
    asyncio.run(a.place(fresh("d1", attempt=0)))
    a.evict("d1")
    with pytest.raises(Refused) as refused:
        asyncio.run(a.place(fresh("d1", attempt=0)))
    assert refused.value.status == 409 and refused.value.reason == "stale_attempt"
    assert "d1" in a.parked and "d1" not in a.resident


def test_concurrent_identical_moves_start_the_trajectory_once() -> None:
    pool = Pool()
    a, b = pool.add("a"), pool.add("b")
    asyncio.run(a.place(fresh("t", max_tokens=40)))
    a.evict("t")
    claim = b.claim_from

    async def over_the_network(*args: Any) -> TrajectoryState:
        await asyncio.sleep(0)  # the claim's round trip: the other calls arrive meanwhile
        return await claim(*args)

    b.claim_from = over_the_network

    async def go() -> list[object]:
        request = moved("t", pool.source("a"), attempt=1)
        return await asyncio.gather(*(b.place(request) for _ in range(3)), return_exceptions=True)

    results = asyncio.run(go())
    refusals = [r for r in results if isinstance(r, Refused)]
    assert len(refusals) == 2 and {r.status for r in refusals} == {409}
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert pool.where_resident("t") == ["b"] and len(b.engine.requests) == 1


def test_one_advance_at_a_time_and_no_placement_while_it_runs(tmp_path: Path) -> None:
    pool = Pool()
    w = pool.add("w")
    release = asyncio.Event()

    async def slow(uri: str) -> bytes:
        await release.wait()
        raise ConnectionError("the weights source went away")

    w.fetch_weights, w.weights_dir = slow, tmp_path

    async def go() -> None:
        first = asyncio.create_task(w.advance(_advance(3)))
        await asyncio.sleep(0)
        with pytest.raises(Refused) as refused:
            await w.advance(_advance(5))
        assert refused.value.reason == "advancing"
        with pytest.raises(Refused) as refused:
            await w.place(fresh("t"))
        assert refused.value.reason == "advancing" and w.resident == {}
        release.set()
        with pytest.raises(Refused):
            await first
        await w.place(fresh("t"))  # the advance ended: placements are taken again

    asyncio.run(go())


def _advance(version: int) -> AdvanceRequest:
    return AdvanceRequest(
        version=version, weights_uri=f"http://trainer/v{version}", sha256="0" * 64
    )
