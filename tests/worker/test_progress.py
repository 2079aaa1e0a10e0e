"""A worker that answers but does not decode says so: with residents and no step within
its bound, `/healthz` and `/readyz` answer 503 with the reason and its state carries it,
so the control loop re-queues its work and a liveness probe restarts it. Requests the
model cannot hold are refused before they occupy the engine."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cadence.worker.api import MAX_TOOL_CALLS
from cadence.worker.app import create_app
from cadence.worker.core import STALL_MIN_S, WorkerCore
from cadence.worker.held import Refused

from .factories import CountingSource, Pool, fresh

TOKEN = "s3cret"


def _get(core: WorkerCore, path: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(core, TOKEN, run_decode_loop=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as http:
            return await http.get(path, headers={"Authorization": f"Bearer {TOKEN}"})

    return asyncio.run(go())


def test_residents_and_no_step_within_the_bound_turn_health_503_with_the_reason() -> None:
    pool = Pool()
    core = pool.add("w")
    assert _get(core, "/healthz").status_code == 200
    pool.clock.work(10 * STALL_MIN_S)  # idle time is not a stall
    asyncio.run(core.place(fresh("t")))
    assert core.stall_bound_s() >= STALL_MIN_S
    pool.clock.work(core.stall_bound_s() - 1)
    assert _get(core, "/healthz").status_code == 200 and core.state().stalled is None

    pool.clock.work(2)

    for path in ("/healthz", "/readyz"):
        answer = _get(core, path)
        assert answer.status_code == 503
        assert answer.json()["reason"] == "stalled"
        assert "no decode step for" in answer.json()["error"]
    assert core.state().stalled is not None
    asyncio.run(core.step())  # it steps again
    assert _get(core, "/healthz").status_code == 200 and core.state().stalled is None


def test_a_pinned_stall_bound_is_kept() -> None:
    core = Pool().add("w")
    core.stall_after_s = 5.0
    assert core.stall_bound_s() == 5.0


class Positions(CountingSource):
    max_model_len: int | None = 64


def test_a_prompt_and_budget_beyond_the_models_positions_are_refused_422() -> None:
    core = Pool().add("w", source=Positions())
    with pytest.raises(Refused) as refused:
        asyncio.run(core.place(fresh("t", prompt=16, max_tokens=49)))
    assert refused.value.status == 422 and refused.value.reason == "too_long"
    assert "exceed the model's 64 positions" in str(refused.value)
    assert core.resident == {} and core.engine.requests == {}
    asyncio.run(core.place(fresh("t", prompt=16, max_tokens=48)))  # exactly fits
    assert "t" in core.resident


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", 10**30), ("max_tool_calls", MAX_TOOL_CALLS + 1), ("max_tokens", 0)],
)
def test_unbounded_counts_are_refused_at_the_boundary(field: str, value: int) -> None:
    core = Pool().add("w")
    body = {
        "id": "t",
        "attempt": 0,
        "version": 0,
        "fresh": {"prompt_token_ids": [1, 2, 3], "max_tokens": 8, field: value},
    }

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(core, TOKEN, run_decode_loop=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as http:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            return await http.post("/v1/trajectories", json=body, headers=headers)

    answer = asyncio.run(go())
    assert answer.status_code == 422 and field in answer.json()["error"]
    assert core.resident == {}
