"""The emulator and the operator in one event loop on fake time, as kopf's own tests run.

`on_fake_time` runs an `async def` test in a looptime event loop of its own thread; in
it, `operating()` serves the emulator and runs the operator (kopf, the production
registry, its resync at the production period). Every request is answered within the
loop, so the loop's clock moves only when every task waits on a timer, and then at once:
a resync, kopf's batching windows, a lease's retry take no wall time, and what the
operator measures in seconds (its rates, its waits) it measures on the same fake clock.

A test waits with `Cluster.until`, which checks its condition again each time the
emulator stores a write (every reconcile writes a status), never on a wall-clock poll;
its budget is in fake seconds. A run of the operator that takes real processes (the
kubelet stand-in's pods) or another program (`kubectl`) stays on real time
(`harness.py`): fake time cannot move their clocks."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import httpx
import kopf
import looptime
import yaml

from cadence.devcluster.emulator import ApiError, KubernetesEmulator, served
from cadence.operator.kube.client import Kube
from cadence.operator.kube.handlers import Reconciler
from cadence.operator.kube.serve import operator_registry
from tests.helpers import ROOT, reconciles_of

from .harness import CRDS, PODS

P = ParamSpec("P")
T = TypeVar("T")

# The operator's resync, as shipped (`cadence operator --resync`): on fake time the
# test does not wait it out.
RESYNC_S = 5.0
# What a wait may take, in fake seconds: a chain of resyncs, never reached when the
# operator does its job (a wait that fails takes a few real seconds, not minutes).
WAIT_S = 120.0
# How often a wait looks again with no write to wake it, in fake seconds: a condition
# on the operator's memory (its metrics, its control tasks) rather than on the API.
LOOK_S = 1.0


def on_fake_time(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """`test` (an `async def`) run to its end in a looptime event loop of a thread of its
    own: the thread keeps kopf from taking the test process's signals, which it does
    in the main thread."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        failed: list[BaseException] = []

        def main() -> None:
            loop = looptime.new_event_loop(noop_cycles=42)
            try:
                loop.run_until_complete(test(*args, **kwargs))
            except BaseException as e:
                failed.append(e)
            finally:
                loop.close()

        thread = threading.Thread(target=main, name=test.__name__, daemon=True)
        thread.start()
        thread.join()
        if failed:
            raise failed[0]

    return run


@dataclass
class Cluster:
    """The emulator (its URL, its state) and the operator's reconciler, in the test's loop."""

    kube: KubernetesEmulator
    url: str
    http: httpx.AsyncClient
    reconciler: Reconciler | None = None

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """One JSON request, as `emulator.call` makes it (PATCH as a merge patch); raises
        `ApiError` on an error status."""
        content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
        answer = await self.http.request(
            method,
            self.url + path,
            content=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": content_type},
        )
        try:
            found = answer.json()
        except ValueError:
            found = answer.text
        if answer.is_error:
            raise ApiError(answer.status_code, found)
        return found

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.call("GET", path)
        except ApiError:
            return None
        return found

    async def pods(self, group: str | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await self.call("GET", PODS))["items"]
        return [
            p
            for p in items
            if group is None or p["metadata"]["labels"].get("cadence.dev/group") == group
        ]

    async def status(self, path: str) -> dict[str, Any]:
        found: dict[str, Any] = (await self.call("GET", path)).get("status") or {}
        return found

    async def events(self, reason: str) -> list[dict[str, Any]]:
        items = (await self.call("GET", "/api/v1/namespaces/default/events"))["items"]
        return [e for e in items if e.get("reason") == reason]

    async def until(
        self, check: Callable[[], Awaitable[T | bool | None]], what: str, within_s: float = WAIT_S
    ) -> T:
        """The first truthy value of `check()`, tried now and again after each write the
        emulator stores (or `LOOK_S` fake seconds without one); fails naming `what` and
        the last value after `within_s` fake seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while True:
            value = await check()
            if value:
                return value  # type: ignore[return-value]
            if loop.time() >= deadline:
                raise AssertionError(f"not within {within_s:.0f} s (fake): {what}; last {value!r}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.kube.written(), timeout=LOOK_S)

    async def reconciled_again(self, plural: str, name: str, times: int = 2) -> None:
        """Until `name` has been reconciled `times` more times than now; with two, at least
        one of them started after this call (the first may have been under way)."""
        assert self.reconciler is not None
        metrics = self.reconciler.metrics
        now = reconciles_of(metrics, plural, name)

        async def done() -> bool:
            return reconciles_of(metrics, plural, name) >= now + times

        await self.until(done, f"{times} more reconciles of {plural}/{name} (after {now})")


@contextlib.asynccontextmanager
async def emulating(kube: KubernetesEmulator | None = None) -> AsyncIterator[Cluster]:
    """The emulator, served in this loop with the CRDs applied."""
    kube = kube if kube is not None else KubernetesEmulator()
    async with served(kube) as url, httpx.AsyncClient(timeout=30.0) as http:
        cluster = Cluster(kube, url, http)
        for path in sorted((ROOT / "crds").glob("*.cadence.dev.yaml")):
            await cluster.call("POST", CRDS, yaml.safe_load(path.read_text()))
        yield cluster


@contextlib.asynccontextmanager
async def operator(
    cluster: Cluster, make: Callable[[Kube], Reconciler] = Reconciler
) -> AsyncIterator[Reconciler]:
    """The operator against `cluster`, in this loop, from entry to exit (an operator
    restart's first half); yields its reconciler."""
    kube = Kube(cluster.url)
    reconciler = make(kube)
    stop = asyncio.Event()
    running = asyncio.create_task(
        kopf.operator(
            registry=operator_registry(kube, cluster.url, reconciler, resync_s=RESYNC_S),
            standalone=True,
            namespaces=["default"],
            stop_flag=stop,
        )
    )
    cluster.reconciler = reconciler
    try:
        yield reconciler
    finally:
        stop.set()
        await running
        await kube.aclose()
        cluster.reconciler = None


@contextlib.asynccontextmanager
async def operating(
    kube: KubernetesEmulator | None = None, make: Callable[[Kube], Reconciler] = Reconciler
) -> AsyncIterator[Cluster]:
    """The emulator with the operator running against it."""
    async with emulating(kube) as cluster, operator(cluster, make):
        yield cluster
