"""Fuzzing every HTTP endpoint of the worker, the worker host, the trainer and the
reference environment (issue 19): random methods' paths and path parameters, bodies
(random bytes, random JSON, and valid bodies with one field replaced by anything),
encodings and header forms, with and without the token. The property: every answer is
2xx or 4xx, never 5xx, and the service still works afterwards: a worker still decodes a
trajectory placed after each case, the trainer still ingests and answers, the
environment still answers a tool call.

The routes are read from each app, so an endpoint added later is fuzzed too.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import gzip
import itertools
import json
import os
import re
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from starlette.routing import Mount

from cadence.trainer.app import create_app as trainer_app
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer
from cadence.worker import calculator
from cadence.worker.app import create_app as worker_app
from cadence.worker.core import WorkerCore
from cadence.worker.emulated import EmulatedEngine
from cadence.worker.held import Identity
from cadence.worker.host import create_host_app
from tests.trainer.factories import delivery
from tests.worker.factories import CountingSource, FakeClock, deployment, fresh

TOKEN = "s3cret"
# Cases per service; the CI runs 150 of each. CADENCE_FUZZ_CASES runs more, alone.
CASES = int(os.environ.get("CADENCE_FUZZ_CASES", "150"))

# Values at the edges validation tends to miss: past 32 and 64 bits, non-finite,
# empty, NUL, long.
EDGES = st.sampled_from(
    [2**31, 2**63, 2**64, 2**70, -1, -(2**63) - 1, 1e308, 1e-300, "", "\x00", "a" * 10_000]
)
EDGES |= st.sampled_from([float("nan"), float("inf"), -float("inf")])
JSON = st.recursive(
    st.none()
    | EDGES
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=50),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)
PARAM = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.text(
        alphabet=st.characters(codec="utf-8", exclude_characters="/?#"), min_size=1, max_size=30
    ),
    st.sampled_from(["g0-s0", "t", "0", "1", "-1", "..", "%00", "w0"]),
)


@dataclass
class Target:
    """One service under fuzz: its app, a valid body per route (to mutate), and a check
    that it still works."""

    name: str
    app: FastAPI
    samples: dict[str, dict[str, Any]]
    works: Callable[[httpx.AsyncClient], Any]
    ids: list[str] = dataclasses.field(default_factory=list)  # real path parameters


def _routes(app: FastAPI, prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for route in app.routes:
        if isinstance(route, APIRoute):
            out += [(m, prefix + route.path) for m in sorted(route.methods)]
        elif isinstance(route, Mount) and isinstance(route.app, FastAPI):
            out += _routes(route.app, prefix + route.path)
    return out


def _leaves(body: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path to every value in `body`, containers included."""
    found = [at]
    if isinstance(body, dict):
        for k, v in body.items():
            found += _leaves(v, (*at, k))
    elif isinstance(body, list):
        for i, v in enumerate(body):
            found += _leaves(v, (*at, i))
    return found


def _mutate(data: st.DataObject, body: Any) -> Any:
    """`body` with one value anywhere in it replaced: by an edge value or any JSON."""
    where = data.draw(st.sampled_from(_leaves(body)))
    value = data.draw(EDGES | JSON)
    if not where:
        return value
    copy = json.loads(json.dumps(body))
    node = copy
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    return copy


def _request(data: st.DataObject, target: Target, routes: list[tuple[str, str]]) -> dict[str, Any]:
    with_body = [r for r in routes if r[1] in target.samples]
    # Mostly near-valid requests with the token: those reach past the first refusals.
    near = bool(with_body) and data.draw(st.integers(0, 9)) < 7
    method, template = data.draw(st.sampled_from(with_body if near else routes))
    ids = st.sampled_from(target.ids) if target.ids and near else PARAM
    path = re.sub(r"\{[^}]+\}", lambda _: urllib.parse.quote(data.draw(ids), safe=""), template)
    kinds = ["mutated"] * 7 + ["valid"] if near else ["none", "bytes", "json", "mutated"]
    kind = data.draw(st.sampled_from(kinds))
    sample = target.samples.get(template)
    body: bytes | None = None
    if kind == "bytes":
        body = data.draw(st.binary(max_size=2048))
    elif kind == "json":
        body = json.dumps(data.draw(JSON)).encode()
    elif kind in ("mutated", "valid") and sample is not None:
        value = sample if kind == "valid" else _mutate(data, sample)
        body = json.dumps(value).encode()
    headers: dict[str, str] = {}
    auth = data.draw(st.sampled_from(["token"] * 8 + ["none", "wrong", "garbage", "basic"]))
    headers["authorization"] = {
        "token": f"Bearer {TOKEN}",
        "none": "",
        "wrong": "Bearer nope",
        "garbage": "Bearer \x7f\t" + "a" * 300,
        "basic": "Basic dXNlcjpwYXNz",
    }[auth]
    if not headers["authorization"]:
        del headers["authorization"]
    content_type = data.draw(
        st.sampled_from(["application/json", "text/plain", "", "application/x-www-form-urlencoded"])
    )
    if content_type:
        headers["content-type"] = content_type
    if body is not None and data.draw(st.booleans()):
        encoding = data.draw(st.sampled_from(["gzip", "br", "identity"]))
        headers["content-encoding"] = encoding
        if encoding == "gzip" and data.draw(st.booleans()):
            body = gzip.compress(body)
    if body is not None and data.draw(st.booleans()):
        headers["content-length"] = str(data.draw(st.integers(0, len(body))))
    return {"method": method, "url": path, "content": body, "headers": headers}


async def _send(app: FastAPI, request: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://s") as http:
        try:
            return await http.request(**request)
        except httpx.LocalProtocolError:  # httpx itself will not send it (a bad header)
            return httpx.Response(400)


def _fuzz(target: Target) -> None:
    routes = _routes(target.app)
    answered: collections.Counter[int] = collections.Counter()

    @settings(
        max_examples=CASES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=st.data())
    def case(data: st.DataObject) -> None:
        request = _request(data, target, routes)

        async def go() -> None:
            response = await _send(target.app, request)
            assert response.status_code < 500, (request, response.status_code, response.text)
            event(f"answered {response.status_code}")
            answered[response.status_code] += 1
            transport = httpx.ASGITransport(app=target.app)
            async with httpx.AsyncClient(
                transport=transport,
                base_url="http://s",
                headers={"authorization": f"Bearer {TOKEN}"},
            ) as http:
                await target.works(http)

        asyncio.run(go())

    case()
    print(f"{target.name}: {len(routes)} routes, answers {dict(sorted(answered.items()))}")
    assert answered[200] + answered[204] > 0  # some cases got through to the service


# --- the services ---------------------------------------------------------------------


def _worker_core(wid: str = "w0") -> WorkerCore:
    clock = FakeClock()
    engine = EmulatedEngine(deployment(capacity=100_000), CountingSource(), clock=clock)

    async def peer(*_: object) -> Any:
        raise ConnectionError("no peer here")

    return WorkerCore(Identity(wid, "H800", 0), engine, clock, peer, peer, 0)


_ids = itertools.count()


def _decodes(core: WorkerCore, root: str = "") -> Callable[[httpx.AsyncClient], Any]:
    async def works(http: httpx.AsyncClient) -> None:
        core.draining = False  # a fuzzed /v1/drain is legitimate; the next case starts anew
        rid = f"check-{next(_ids)}"
        version = core.version or 0
        placed = await http.post(
            f"{root}/v1/trajectories",
            json=fresh(rid, version=version, max_tokens=3).model_dump(mode="json"),
        )
        assert placed.status_code == 200, placed.text
        while rid in core.resident:
            await core.step()
        assert any(s.id == rid for s in core.finished), "the check trajectory never finished"
        core.finished.clear()

    return works


def _worker() -> Target:
    core = _worker_core()
    place = fresh("t").model_dump(mode="json")
    samples = {
        "/v1/trajectories": place,
        "/v1/parked/{rid}/claim": {"attempt": 1, "destination": "w1"},
        "/v1/parked/{rid}/release": {"attempt": 1, "destination": "w1"},
        "/v1/advance": {"version": 1, "weights_uri": "/etc/passwd", "sha256": "0" * 64},
    }
    app = worker_app(core, TOKEN, run_decode_loop=False)
    return Target("worker", app, samples, _decodes(core), ["t", "0", "1"])


def _host() -> Target:
    core = _worker_core("w0")
    place = fresh("t").model_dump(mode="json")
    samples: dict[str, dict[str, Any]] = {
        "/v1/place": {"items": [{"worker": "w0", "request": place}]},
        "/v1/evict": {"items": [{"worker": "w0", "id": "t"}]},
        "/w0/v1/trajectories": place,
    }
    app = create_host_app({"w0": core}, TOKEN)
    return Target("host", app, samples, _decodes(core, "/w0"), ["t", "0", "1"])


def _trainer(folder: Path, model: Path) -> Iterator[Target]:
    config = TrainerConfig(
        model_path=model, state_dir=folder, group_size=2, batch_groups=1, iterations=4
    )
    trainer = Trainer(config)
    trainer.admit(1)
    prompt = trainer.ledger.group(0).prompt
    samples = {
        "/v1/trajectories": delivery("g0-s0", prompt=prompt).model_dump(mode="json"),
        "/v1/admit": {"groups": 1},
        "/v1/samples/{sid}/record": {"attempt": 1, "state": "placed", "worker": "w0"},
        "/v1/samples/record": {"records": [{"id": "g0-s1", "attempt": 1, "state": "placed"}]},
        "/v1/prompts": {"prompts": [{"text": "1 + 1", "answer": "2"}]},
        "/v1/publish": {"version": 1, "weights_uri": "/etc/passwd", "sha256": "0" * 64},
    }

    async def works(http: httpx.AsyncClient) -> None:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/v1/stats")).status_code == 200
        assert (await http.get("/v1/ledger")).status_code == 200

    ids = ["g0-s0", "g0-s1", "0", "1"]
    yield Target("trainer", trainer_app(trainer, TOKEN, train=False), samples, works, ids)
    trainer.ledger.close()


def _environment() -> Target:
    app = calculator.create_app(TOKEN)
    call: dict[str, Any] = {
        "trajectory_id": "t",
        "attempt": 0,
        "call_index": 0,
        "text": "<tool>calc 1+1</tool>",
    }

    async def works(http: httpx.AsyncClient) -> None:
        body = {**call, "trajectory_id": f"check-{next(_ids)}"}
        answer = await http.post("/v1/tool", json=body)
        assert answer.status_code == 200 and answer.json() == {"observation": "<result>2</result>"}

    return Target("environment", app, {"/v1/tool": call}, works)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["worker", "host", "trainer", "environment"])
def test_no_request_makes_a_service_fail_or_stall(
    name: str, tmp_path: Path, tiny_model: Path
) -> None:
    if name == "trainer":
        targets = _trainer(tmp_path, tiny_model)
        _fuzz(next(targets))
        next(targets, None)
        return
    _fuzz({"worker": _worker, "host": _host, "environment": _environment}[name]())
