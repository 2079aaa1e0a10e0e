"""What every Cadence HTTP service shares: one-sentence problems, the bearer token on
control endpoints, the body-size limit, validation errors as 422 with the field, and how
clients trust the pool's certificate authority.

The worker, the worker host, the trainer and the reference environment all install these,
so a client sees the same refusals everywhere: a `Problem` body with a reason and one
sentence. The gate runs before a request's body is read, because a body is where a
caller without the token could spend a service's memory: a guarded path without the
token is refused unread, and a body is counted as it streams and refused the moment it
passes the limit, whatever its Content-Length said (or whether it said anything). A 422
names the field and never echoes what was sent. The API docs are not served: they are
for developers, who have the source, and every other path is either guarded or a probe.

Transport security is optional and outside the token: a service serves TLS when given a
certificate (`--tls-cert`, `--tls-key`), and every `ServiceClient` in a process trusts
the CA bundle `CADENCE_CA_FILE` names, so nothing threads a CA through constructors.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hmac
import json
import os
import socket
import sqlite3
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import Depends, FastAPI, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cadence.common.problem import Problem

# A body larger than this is refused as it streams, before it is parsed (413).
MAX_BODY_BYTES = 8 * 1024 * 1024
# A body must arrive whole within this many seconds of its request's start (408): a
# client holding the token could otherwise keep a request, and what it holds, open for
# ever by sending a byte a minute. The largest body takes well under a second here.
BODY_DEADLINE_S = 60.0
# The environment variables naming the pool's bearer token and the CA bundle clients
# verify services with.
TOKEN_ENV = "CADENCE_TOKEN"
CA_FILE_ENV = "CADENCE_CA_FILE"
# A 422's sentence is at most this long, and each part of the field's path at most
# `_PART`: the path can hold keys the caller chose.
_SENTENCE = 200
_PART = 40
_DOCS = ("docs_url", "redoc_url", "openapi_url", "swagger_ui_oauth2_redirect_url")


class Refusal(Exception):
    """A request a service will not carry out; `status` is the HTTP status to answer."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def problem(status: int, reason: str, message: str) -> JSONResponse:
    """A refusal's answer: one sentence, clipped (it may quote an id from the path)."""
    body = Problem(error=_clip(message, 2 * _SENTENCE), reason=reason)
    return JSONResponse(body.model_dump(), status_code=status)


def _unauthorised() -> JSONResponse:
    return problem(401, "unauthorised", "a valid bearer token is required")


def _too_large() -> JSONResponse:
    return problem(413, "too_large", f"the body exceeds {MAX_BODY_BYTES} bytes")


def _bearer(headers: Headers, token: str) -> bool:
    given = headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


class _TooLarge(Exception):
    """Raised into whatever reads a body past the limit, to stop it reading."""


class _TooSlow(Exception):
    """Raised into whatever reads a body past its deadline, to stop it waiting."""


def _too_slow() -> JSONResponse:
    return problem(408, "too_slow", f"the body did not arrive within {BODY_DEADLINE_S:g} s")


class _Gate:
    """The token and the size limit, before the app reads anything (a plain ASGI
    middleware: `BaseHTTPMiddleware` would sit between the server and the app's reads).

    Which paths are guarded is read from the routes themselves: a route that depends on
    the token dependency `install` returns. A path no route of this app takes (404, 405,
    or a mounted app, which installs its own gate) is not refused here; none of those
    reads a body before answering."""

    def __init__(
        self, app: ASGIApp, *, routes: Sequence[BaseRoute], token: str, guard: Callable[..., Any]
    ) -> None:
        self.app = app
        self.routes = routes
        self.token = token
        self.guard = guard
        self.needs: dict[int, bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self._guarded(scope) and not _bearer(headers, self.token):
            await _unauthorised()(scope, receive, send)
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            await _too_large()(scope, receive, send)
            return
        await self._limited(scope, receive, send)

    def _guarded(self, scope: Scope) -> bool:
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                if not isinstance(route, APIRoute):
                    return False
                if id(route) not in self.needs:
                    self.needs[id(route)] = self._depends(route.dependant)
                return self.needs[id(route)]
        return False

    def _depends(self, dependant: Dependant) -> bool:
        return any(d.call is self.guard or self._depends(d) for d in dependant.dependencies)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        read, over, late, whole, started = 0, False, False, False, False
        deadline = asyncio.get_running_loop().time() + BODY_DEADLINE_S

        async def counted() -> Message:
            nonlocal read, over, late, whole
            if whole:  # the body is in: what is read now is the client leaving
                return await receive()
            try:
                message = await asyncio.wait_for(
                    receive(), max(0.0, deadline - asyncio.get_running_loop().time())
                )
            except TimeoutError:
                late = True
                raise _TooSlow from None
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                whole = not message.get("more_body", False)
                if read > MAX_BODY_BYTES:
                    over = True
                    raise _TooLarge
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            if (over or late) and not started:
                return  # what the app made of the cut-off body; the answer below replaces it
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except Exception:
            if not (over or late) or started:
                raise
        if (over or late) and not started:
            await (_too_large() if over else _too_slow())(scope, receive, send)


def _clip(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "\u2026"


def _invalid(errors: Sequence[Mapping[str, Any]]) -> str:
    """A validation error as one short sentence naming the field, never the input."""
    first = errors[0] if errors else {}
    where = ".".join(_clip(str(p), _PART) for p in first.get("loc", ()) if p != "body")
    message = str(first.get("msg", "invalid"))
    if first.get("type") == "json_invalid":  # what was wrong with it, not only that it was
        message = f"{message}: {first.get('ctx', {}).get('error', 'malformed')}"
        where = ""
    given = first.get("input")
    if isinstance(given, str) and len(given) > 8 and given in message:
        message = message.replace(given, "the value given")
    return _clip(f"{where or 'body'}: {message}", _SENTENCE)


def _close_docs(app: FastAPI) -> None:
    """No /docs, /redoc or /openapi.json: they describe every control endpoint to anyone."""
    paths = {getattr(app, name) for name in _DOCS} - {None}
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in paths]
    for name in _DOCS:
        setattr(app, name, None)


_REASONS = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            # A body two readers could read two ways (the last key wins in one parser,
            # the first in another) is refused, not guessed at.
            raise json.JSONDecodeError(f"duplicate key {_clip(key, _PART)!r}", "", 0)
        seen[key] = value
    return seen


class _StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), object_pairs_hook=_unique_keys)
        return self._json


class _StrictJsonRoute(APIRoute):
    """Routes whose JSON bodies may not repeat a key."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJsonRequest(request.scope, request.receive))

        return strict


def install(app: FastAPI, token: str, refusals: tuple[type[Exception], ...] = ()) -> Any:
    """Install the token and size gate and the error handlers on `app`, and close its API
    docs; returns the dependency list that guards a control endpoint with the bearer
    token (the gate refuses a request for such an endpoint before reading its body)."""
    if not token:
        raise ValueError("a bearer token is required")
    if app.router.routes and any(isinstance(r, APIRoute) for r in app.router.routes):
        raise ValueError("install the gate before the app's routes")
    app.router.route_class = _StrictJsonRoute
    _close_docs(app)

    def authorised(request: Request) -> None:
        if not _bearer(request.headers, token):
            raise Refusal(401, "unauthorised", "a valid bearer token is required")

    app.add_middleware(_Gate, routes=app.router.routes, token=token, guard=authorised)

    kinds: tuple[type[Exception], ...] = (Refusal, *refusals)
    for kind in kinds:

        @app.exception_handler(kind)
        async def refused(_: Request, e: Any) -> JSONResponse:
            return problem(e.status, e.reason, str(e))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return problem(422, "invalid", _invalid(e.errors()))

    @app.exception_handler(OSError)
    @app.exception_handler(sqlite3.OperationalError)
    async def storage(_: Request, e: Exception) -> JSONResponse:
        """A full disk is the service's trouble, for now: 503, so callers retry (a worker's
        outbox keeps the delivery). Any other error stays a 500."""
        if getattr(e, "errno", None) == errno.ENOSPC or "disk is full" in str(e):
            return problem(503, "disk_full", "the service's disk is full; retry later")
        raise e

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException) -> JSONResponse:
        reason = _REASONS.get(e.status_code, "http")
        detail = e.detail if isinstance(e.detail, str) else "the request was refused"
        return problem(e.status_code, reason, _clip(detail, _SENTENCE))

    return [Depends(authorised)]


# A connection must send a request's headers within this long of opening it or of its
# last response. uvicorn times out only an idle connection that has already had a
# response: one that never sends a request, or stops mid-headers, was held for ever.
HEADERS_S = 30.0

# How long an idle connection is kept for its next request: by a server, and by a client,
# whose keep must be the shorter. A request sent on a connection the server is closing
# gets no answer (httpx's ReadError): with both at their libraries' default of 5 s, a
# client that reused a connection idle for about 5 s lost the request now and then.
SERVER_KEEP_ALIVE_S = 30.0
CLIENT_KEEP_ALIVE_S = 10.0
# httpx's default pool, but with the client's keep-alive above.
CLIENT_LIMITS = httpx.Limits(
    max_connections=100, max_keepalive_connections=20, keepalive_expiry=CLIENT_KEEP_ALIVE_S
)


class _HeadersDeadline:
    """Mixed into uvicorn's HTTP protocol: the deadline above, and the server's
    keep-alive. A request's headers make a new request cycle, which is how the deadline
    knows they came."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: object
    timeout_keep_alive: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = SERVER_KEEP_ALIVE_S

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def on_response_complete(self) -> None:
        self._arm()  # before: a pipelined request starts its cycle inside the call
        super().on_response_complete()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        self._disarm()
        self._armed_cycle = getattr(self, "cycle", None)
        self._deadline = self.loop.call_later(HEADERS_S, self._expire)

    def _disarm(self) -> None:
        deadline: asyncio.TimerHandle | None = getattr(self, "_deadline", None)
        if deadline is not None:
            deadline.cancel()

    def _expire(self) -> None:
        if self.cycle is self._armed_cycle and not self.transport.is_closing():
            self.transport.close()


def http_protocol() -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools where installed, as uvicorn picks) with the
    headers deadline and the server's keep-alive; give it as `uvicorn.Config(http=...)`.
    Clients of these servers take `CLIENT_LIMITS`."""
    base: type[asyncio.Protocol]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: PLC0415

        base = HttpToolsProtocol
    except ImportError:  # httptools is optional
        from uvicorn.protocols.http.h11_impl import H11Protocol  # noqa: PLC0415

        base = H11Protocol
    return type("DeadlineHttpProtocol", (_HeadersDeadline, base), {})


def inherited_sockets(fd: int | None) -> list[socket.socket] | None:
    """The listening socket the parent bound and passed as file descriptor `fd`
    (`--listen-fd`; None: none, the server binds its own port). A parent that binds the
    port before it starts the child leaves no moment in which another process can take
    it (`operator/local/processes.py`)."""
    if fd is None:
        return None
    try:
        sock = socket.socket(fileno=fd)
    except OSError as e:
        raise ValueError(f"--listen-fd {fd} is not an open socket: {e.strerror or e}") from None
    if sock.type != socket.SOCK_STREAM:
        raise ValueError(f"--listen-fd {fd} is not a stream socket")
    return [sock]


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server run inside a program that owns its signals (a bench, a test
    suite): uvicorn's own `serve()` takes SIGINT and SIGTERM for as long as it serves,
    so Ctrl-C only asked it to shut down (and waited on any request still open) instead
    of reaching the program. Its owner stops it with `should_exit`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def background(work: Callable[[], Coroutine[Any, Any, None]] | None) -> Any:
    """A FastAPI lifespan that runs `work()` for the app's lifetime (None: nothing)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(work()) if work is not None else None
        yield
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return lifespan


def client_verify() -> ssl.SSLContext | bool:
    """How a client verifies the services it calls: against the CA bundle
    `CADENCE_CA_FILE` names (the pool's CA, where its services serve TLS), else the
    system's trust store. A bundle that cannot be loaded is a `ValueError` in one
    sentence, which a service checks at start-up."""
    path = os.environ.get(CA_FILE_ENV, "").strip()
    if not path:
        return _default_context()
    try:
        return _ca_context(path)
    except (OSError, ssl.SSLError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"{CA_FILE_ENV}={path}: cannot load the CA bundle: {why}") from None


@functools.lru_cache(maxsize=4)
def _ca_context(path: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=path)


@functools.cache
def _default_context() -> ssl.SSLContext:
    """The trust store httpx's `verify=True` loads, loaded once: httpx loads it anew for
    every client (about 50 ms of CPU), and a worker makes one per hand-off it claims or
    releases, so a busy host spent most of a bulk placement loading it."""
    return httpx.create_ssl_context()


def read_token(token_file: Path | None) -> str:
    """A service's bearer token, from a file (a mounted Secret) or `CADENCE_TOKEN`; a
    `ValueError` in one sentence when there is none."""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as e:
            raise ValueError(f"cannot read token file {token_file}: {e.strerror}") from None
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ValueError(f"a bearer token is required: --token-file FILE or {TOKEN_ENV}")
    return token


def check_tls(cert: Path | None, key: Path | None) -> None:
    """Refuse, in one sentence (`ValueError`), a half-given or unusable certificate and
    key, and a CA bundle (`CADENCE_CA_FILE`) that cannot be loaded: before a service
    starts, where uvicorn would fail later with a traceback."""
    client_verify()
    if (cert is None) != (key is None):
        raise ValueError("--tls-cert and --tls-key go together: give both, or neither")
    if cert is None or key is None:
        return
    for option, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            path.read_bytes()
        except OSError as e:
            raise ValueError(f"cannot read {option} {path}: {e.strerror}") from None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as e:
        raise ValueError(f"--tls-cert {cert} with --tls-key {key} does not load: {e}") from None


class ServiceError(Exception):
    """A refusal from another Cadence service: its status, reason and sentence."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


async def call_json(
    http: httpx.AsyncClient,
    method: str,
    path: str,
    body: BaseModel | None = None,
    timeout_s: float | None = None,
    *,
    model: type[BaseModel] | None = None,
) -> Any:
    """Send `body` as JSON; the decoded answer (validated as `model` straight from its
    bytes, when given: large answers skip the intermediate dicts), or `ServiceError` from
    its `Problem`."""
    content = body.model_dump_json() if body is not None else None
    headers = {"content-type": "application/json"} if body is not None else None
    timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else httpx.Timeout(timeout_s)
    response = await http.request(method, path, content=content, headers=headers, timeout=timeout)
    if response.is_success:
        if model is not None:
            return model.model_validate_json(response.content)
        return response.json() if response.content else None
    try:
        p = Problem.model_validate_json(response.content)
    except ValueError:
        p = Problem(error=response.text[:200] or response.reason_phrase, reason="http")
    raise ServiceError(response.status_code, p.reason, p.error)


class ServiceClient:
    """An async JSON client for one Cadence service, with the pool's bearer token;
    subclasses name the error their callers catch and their default timeout."""

    error: type[ServiceError] = ServiceError
    default_timeout_s: float = 5.0

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: ssl.SSLContext | bool | None = None,
    ) -> None:
        """`verify`: how the service's certificate is checked (None: `client_verify()`,
        the CA bundle `CADENCE_CA_FILE` names or the system's)."""
        self.url = url.rstrip("/")
        self.http = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=self.default_timeout_s if timeout_s is None else timeout_s,
            transport=transport,
            verify=client_verify() if verify is None else verify,
            limits=CLIENT_LIMITS,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        body: BaseModel | None = None,
        timeout_s: float | None = None,
        *,
        model: type[BaseModel] | None = None,
    ) -> Any:
        try:
            return await call_json(self.http, method, path, body, timeout_s, model=model)
        except ServiceError as e:
            raise self.error(e.status, e.reason, e.message) from None
