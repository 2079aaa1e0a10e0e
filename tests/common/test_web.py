"""What every Cadence service refuses, through `web.install`, and what it never does while
refusing: a guarded path without the token is refused before any of its body is read, a
body over the limit is refused while it streams (chunked, or longer than its
Content-Length says) rather than read whole, a 422 never echoes the input, and the API
docs are not served. Each is checked on every service: worker, worker host, trainer and
the reference environment."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from starlette.types import Message

from cadence.common import web
from cadence.common.web import MAX_BODY_BYTES
from cadence.worker import calculator
from cadence.worker.app import create_app as worker_app
from cadence.worker.core import WorkerCore
from cadence.worker.emulated import EmulatedEngine
from cadence.worker.held import Identity
from cadence.worker.host import create_host_app
from tests.trainer.factories import delivery
from tests.worker.factories import CountingSource, FakeClock, deployment

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHUNK = 64 * 1024


@dataclass
class Service:
    app: FastAPI
    guarded: str  # a guarded POST path that takes a JSON body
    open: str  # a GET path anyone may call
    sample: dict[str, Any]  # a body `guarded` validates
    root: str = ""  # where the service's own paths start (a hosted worker's /ID)


def _core() -> WorkerCore:
    engine = EmulatedEngine(deployment(), CountingSource(), clock=FakeClock())

    async def peer(*_: object) -> Any:
        raise AssertionError("no peer is involved")

    return WorkerCore(Identity("w0", "H800", 0), engine, FakeClock(), peer, peer, 0)


def _trainer(folder: Path, tiny_model: Path) -> Iterator[Service]:
    from cadence.trainer.app import create_app  # noqa: PLC0415
    from cadence.trainer.config import TrainerConfig  # noqa: PLC0415
    from cadence.trainer.trainer import Trainer  # noqa: PLC0415

    config = TrainerConfig(model_path=tiny_model, state_dir=folder, group_size=2, batch_groups=1)
    trainer = Trainer(config)
    sample = delivery("g0-s0").model_dump(mode="json")
    app = create_app(trainer, TOKEN, train=False)
    yield Service(app, "/v1/trajectories", "/v1/version", sample)
    trainer.ledger.close()


PLACE = {"id": "t", "attempt": 0, "version": 0, "fresh": {"prompt_token_ids": [1], "max_tokens": 1}}
CALL = {"trajectory_id": "t", "attempt": 0, "call_index": 0, "text": "<tool>calc 1</tool>"}
SERVICES: dict[str, Callable[[], Service]] = {
    "worker": lambda: Service(
        worker_app(_core(), TOKEN, run_decode_loop=False), "/v1/trajectories", "/healthz", PLACE
    ),
    "host": lambda: Service(
        create_host_app({"w0": _core()}, TOKEN), "/v1/place", "/healthz", {"items": []}
    ),
    "hosted worker": lambda: Service(
        create_host_app({"w0": _core()}, TOKEN), "/w0/v1/trajectories", "/w0/readyz", PLACE, "/w0"
    ),
    "environment": lambda: Service(calculator.create_app(TOKEN), "/v1/tool", "/healthz", CALL),
}


@pytest.fixture(params=[*SERVICES, "trainer"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    if request.param == "trainer":
        yield from _trainer(tmp_path, request.getfixturevalue("tiny_model"))
    else:
        yield SERVICES[request.param]()


class Body:
    """A streamed request body of `total` bytes that counts what the server pulled."""

    def __init__(self, total: int, piece: bytes = b"x" * CHUNK) -> None:
        self.total = total
        self.piece = piece
        self.read = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.read < self.total:
            self.read += len(self.piece)
            yield self.piece


def _send(app: FastAPI, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as http:
            return await http.request(method, path, **kwargs)

    return asyncio.run(go())


def test_a_guarded_path_without_the_token_is_refused_before_its_body_is_read(
    service: Service,
) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        body = Body(3 * MAX_BODY_BYTES)
        r = _send(service.app, "POST", service.guarded, content=body, headers=headers)
        assert (r.status_code, r.json()["reason"]) == (401, "unauthorised")
        assert body.read == 0


def test_a_chunked_body_over_the_limit_is_refused_as_it_streams(service: Service) -> None:
    body = Body(3 * MAX_BODY_BYTES)
    r = _send(service.app, "POST", service.guarded, content=body, headers=AUTH)
    assert (r.status_code, r.json()["reason"]) == (413, "too_large")
    assert str(MAX_BODY_BYTES) in r.json()["error"]
    assert body.read <= MAX_BODY_BYTES + CHUNK


def test_a_body_longer_than_its_content_length_is_refused_at_the_limit(service: Service) -> None:
    body = Body(3 * MAX_BODY_BYTES)
    headers = {**AUTH, "content-length": "100", "content-type": "application/json"}
    r = _send(service.app, "POST", service.guarded, content=body, headers=headers)
    assert (r.status_code, r.json()["reason"]) == (413, "too_large")
    assert body.read <= MAX_BODY_BYTES + CHUNK


def test_a_declared_length_over_the_limit_is_refused_unread(service: Service) -> None:
    body = Body(3 * MAX_BODY_BYTES)
    headers = {**AUTH, "content-length": str(3 * MAX_BODY_BYTES)}
    r = _send(service.app, "POST", service.guarded, content=body, headers=headers)
    assert (r.status_code, r.json()["reason"]) == (413, "too_large")
    assert body.read == 0


def test_a_validation_error_is_short_and_never_echoes_the_input(service: Service) -> None:
    """A 422 names the field in one short sentence; a misspelt key is named, clipped,
    and a value is never repeated back (the old answer held all 100 kB of it)."""
    huge = "y" * 100_000
    key = {**service.sample, huge: 1}
    for body in (key, {huge: 1}, [huge], {k: huge for k in service.sample}):
        r = _send(service.app, "POST", service.guarded, json=body, headers=AUTH)
        assert r.status_code == 422, r.text[:300]
        problem = r.json()
        assert problem["reason"] == "invalid" and len(problem["error"]) <= 200
        assert "y" * 41 not in r.text
    r = _send(
        service.app, "POST", service.guarded, json={**service.sample, "bogus": 1}, headers=AUTH
    )
    assert r.json()["error"] == "bogus: Extra inputs are not permitted"


def test_the_api_docs_are_not_served(service: Service) -> None:
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        for headers in ({}, AUTH):
            r = _send(service.app, "GET", service.root + path, headers=headers)
            assert r.status_code == 404, (path, r.status_code)
            assert "openapi" not in r.text.lower() and "swagger" not in r.text.lower()


def test_open_paths_answer_without_the_token(service: Service) -> None:
    assert _send(service.app, "GET", service.open).status_code == 200


def test_a_connection_that_never_completes_its_headers_is_closed_and_others_are_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """uvicorn times out only idle connections that have had a response; one that opens
    and stalls mid-headers was held for ever. The deadline closes it, and a request that
    completes its headers in time is answered as before."""
    monkeypatch.setattr(web, "HEADERS_S", 0.5)
    app = SERVICES["environment"]().app

    async def go() -> tuple[bytes, int]:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="error", http=web.http_protocol()
        )
        server = web.EmbeddedServer(config)
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never ends its headers
        await writer.drain()
        closed = await asyncio.wait_for(reader.read(), timeout=60)  # b"" once closed
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"http://127.0.0.1:{port}/healthz")
        writer.close()
        server.should_exit = True
        await serving
        return closed, answer.status_code

    closed, status = asyncio.run(go())
    assert closed == b"" and status == 200


_SERVES_THEN_WAITS = """
import asyncio
import json
import uvicorn
from fastapi import FastAPI
from starlette.types import Message
from cadence.common import web

app = FastAPI()

@app.get("/slow")
async def slow():
    await asyncio.sleep(600)

async def main():
    server = web.EmbeddedServer(uvicorn.Config(app, port=0, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /slow HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")  # open while it serves
    await writer.drain()
    print("serving", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_ctrl_c_reaches_a_program_that_serves_in_process() -> None:
    # uvicorn's own Server takes SIGINT while it serves, then waits for open requests to
    # end: a bench or a test suite running the trainer in process was not interrupted.
    program = subprocess.Popen(
        [sys.executable, "-c", _SERVES_THEN_WAITS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert program.stdout is not None and program.stdout.readline() == "serving\n"
        program.send_signal(signal.SIGINT)
        _, err = program.communicate(timeout=60)
    finally:
        program.kill()
    assert program.returncode != 0 and "KeyboardInterrupt" in err


def test_a_body_that_trickles_in_past_its_deadline_is_refused_with_408(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token holder sending a byte now and then held its request open for ever."""
    monkeypatch.setattr(web, "BODY_DEADLINE_S", 0.2)
    answered: list[Message] = []

    async def go() -> None:
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": b"{", "more_body": True}
            await asyncio.sleep(3600)  # the rest never comes
            raise AssertionError("unreachable")

        async def send(message: Message) -> None:
            answered.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "path": service.guarded,
            "raw_path": service.guarded.encode(),
            "query_string": b"",
            "root_path": "",
            "scheme": "http",
            "server": ("svc", 80),
            "client": ("127.0.0.1", 1),
            "headers": [
                (b"authorization", AUTH["Authorization"].encode()),
                (b"content-type", b"application/json"),
            ],
        }
        await asyncio.wait_for(service.app(scope, receive, send), timeout=30)

    asyncio.run(go())
    start = next(m for m in answered if m["type"] == "http.response.start")
    body = json.loads(
        b"".join(m.get("body", b"") for m in answered if m["type"] == "http.response.body")
    )
    assert start["status"] == 408 and body["reason"] == "too_slow"
