"""An exception as one readable clause, for logs, status conditions and events.

`f"{type(e).__name__}: {e}"` prints `ReadTimeout: ` for httpx's timeouts, whose message
is empty, and says nothing of which call failed. `describe` names the type, what happened
and, for an HTTP call that failed on the way, the method and URL.
"""

from __future__ import annotations

import contextlib

import httpx

_SILENT = {  # what an exception that carries no message meant
    httpx.ConnectTimeout: "no connection within the timeout",
    httpx.ReadTimeout: "no answer within the timeout",
    httpx.WriteTimeout: "the request could not be sent within the timeout",
    httpx.PoolTimeout: "no free connection within the timeout",
}


def describe(error: BaseException) -> str:
    what = str(error) or next(
        (said for kind, said in _SILENT.items() if isinstance(error, kind)), "no detail given"
    )
    where = ""
    if isinstance(error, httpx.RequestError):
        with contextlib.suppress(RuntimeError):  # raised before any request was made
            where = f" ({error.request.method} {error.request.url})"
    return f"{type(error).__name__}: {what}{where}"
