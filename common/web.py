"""What every Cadence HTTP service shares: one-sentence problems, the bearer token on
control endpoints, the body-size limit, and validation errors as 422 with the field.

The worker and the trainer both install these, so a client sees the same refusals
everywhere: a `Problem` body with a reason and one sentence.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

# A body larger than this is refused before it is parsed (413).
MAX_BODY_BYTES = 8 * 1024 * 1024


class Problem(BaseModel):
    """Every 4xx/5xx body: one sentence a person can act on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    error: str
    reason: str


class Refusal(Exception):
    """A request a service will not carry out; `status` is the HTTP status to answer."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def problem(status: int, reason: str, message: str) -> JSONResponse:
    return JSONResponse(Problem(error=message, reason=reason).model_dump(), status_code=status)


def install(app: FastAPI, token: str, refusals: tuple[type[Exception], ...] = ()) -> Any:
    """Install the size limit and error handlers on `app`; returns the dependency list
    that guards a control endpoint with the bearer token."""
    if not token:
        raise ValueError("a bearer token is required")

    @app.middleware("http")
    async def limit_body(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            return problem(413, "too_large", f"the body exceeds {MAX_BODY_BYTES} bytes")
        if length is None and request.method == "POST":
            body = await request.body()
            if len(body) > MAX_BODY_BYTES:
                return problem(413, "too_large", f"the body exceeds {MAX_BODY_BYTES} bytes")
        return await call_next(request)

    kinds: tuple[type[Exception], ...] = (Refusal, *refusals)
    for kind in kinds:

        @app.exception_handler(kind)
        async def refused(_: Request, e: Any) -> JSONResponse:
            return problem(e.status, e.reason, str(e))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid body"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return problem(422, "invalid", f"{where}: {first.get('msg', 'invalid')}")

    def authorised(request: Request) -> None:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise Refusal(401, "unauthorised", "a valid bearer token is required")

    return [Depends(authorised)]


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
) -> Any:
    """Send `body` as JSON; the decoded answer, or `ServiceError` from its `Problem`."""
    content = body.model_dump_json() if body is not None else None
    headers = {"content-type": "application/json"} if body is not None else None
    timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else httpx.Timeout(timeout_s)
    response = await http.request(method, path, content=content, headers=headers, timeout=timeout)
    if response.is_success:
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
    ) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=self.default_timeout_s if timeout_s is None else timeout_s,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(
        self, method: str, path: str, body: BaseModel | None = None, timeout_s: float | None = None
    ) -> Any:
        try:
            return await call_json(self.http, method, path, body, timeout_s)
        except ServiceError as e:
            raise self.error(e.status, e.reason, e.message) from None


async def fetch(uri: str, token: str) -> bytes:
    """Bytes from an http(s) URI (with the pool's token) or a path."""
    if uri.startswith(("http://", "https://")):
        async with httpx.AsyncClient(timeout=300.0) as http:
            r = await http.get(uri, headers={"Authorization": f"Bearer {token}"})
            r.raise_for_status()
            return r.content
    return Path(uri.removeprefix("file://")).read_bytes()
