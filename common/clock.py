"""The clock the operator's waits are read on: the running event loop's.

In production it is `time.monotonic`. A test that runs the operator on an event loop with
fake time (looptime) moves every timer and every duration the operator measures at once,
which it could not if some parts read `time.monotonic` and others slept on the loop."""

from __future__ import annotations

import asyncio
import time


def loop_time() -> float:
    """Seconds on the running event loop's clock; `time.monotonic` outside a loop."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()
