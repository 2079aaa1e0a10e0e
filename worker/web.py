"""What every Cadence HTTP service shares: one-sentence problems, the bearer token on
control endpoints, the body-size limit, and validation errors as 422 with the field.

The worker and the trainer both install these, so a client sees the same refusals
everywhere: a `Problem` body with a reason and one sentence.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from cadence.worker.api import MAX_BODY_BYTES, Problem


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
