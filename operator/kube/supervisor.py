"""What kopf's timers and daemons would do, without the finalizer they put on every object.

kopf blocks the deletion of any object that has a timer or a daemon until the operator
has stopped them, so with the operator down, `kubectl delete rpool` hangs. Cadence needs
no cleanup of its own when an object goes (owner references collect the children; a
pool whose run is gone is released by the pool's reconcile), so the periodic reconcile
and each run's control loop live here instead, in one task the operator starts:

- `saw` keeps the last body kopf's watch delivered for every object of the three kinds
  (kopf's event handlers, which need no finalizer), and forgets an object when its
  DELETED event comes: that is also what stops a deleted run's loop;
- every `interval_s`, each object is reconciled again (what notices a pool released, a
  pod gone) and its status written, through the same `Handling` as kopf's change
  handlers, so the two never act on one object at once;
- each TrainingRun has one control loop task while it exists; a loop that returned (a
  finished run, a pool not yet bound) is started again on the next turn and returns at
  once when there is nothing to do; a run whose spec changed (a scheduler knob) gets its
  loop ended and a new one started with the new settings, never two at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import kopf

from cadence.operator.kube.client import KubeApi, KubeError, path_of

log = logging.getLogger("cadence.operator")

Key = tuple[str, str, str]  # (plural, namespace, name)
Reconcile = Callable[[Key, Mapping[str, Any], kopf.Patch], Coroutine[Any, Any, None]]
Control = Callable[[dict[str, Any], "Stopped"], Coroutine[Any, Any, None]]


class Stopped:
    """What a control loop checks to know it should end (truthy once asked to)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()


@dataclass
class Loop:
    task: asyncio.Task[None]
    stopped: Stopped
    generation: int | None  # of the run's spec it was started with


@dataclass
class Supervisor:
    kube: KubeApi
    reconcile: Reconcile  # Handling.reconcile, under its per-object lock
    control: Control  # Reconciler.control
    forget: Callable[[Key], None] = lambda key: None  # what else is kept per object
    interval_s: float = 5.0
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep  # a test's fake time
    stop_timeout_s: float = 10.0  # a loop asked to stop is cancelled after this
    seen: dict[Key, dict[str, Any]] = field(default_factory=dict)
    loops: dict[Key, Loop] = field(default_factory=dict)
    stopping: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None

    def saw(self, plural: str, kind: str | None, body: Mapping[str, Any]) -> None:
        """One watch event (`kind` None: the initial listing)."""
        meta = body["metadata"]
        key = (plural, meta.get("namespace") or "", meta["name"])
        if kind == "DELETED":
            self.seen.pop(key, None)
            self._stop(key)
            self.forget(key)
            return
        live = self.seen.setdefault(key, {})
        # One dict per object, updated in place: a run's control loop holds it and reads
        # the run's latest status from it, as a kopf daemon reads its live body.
        live.clear()
        live.update(copy.deepcopy(dict(body)))

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name="supervisor")

    async def _run(self) -> None:
        while True:
            try:
                await self.turn()
            except Exception:  # a bug here must not end every object's resync
                log.exception("the supervisor's turn failed")
            await self.sleep(self.interval_s)

    async def turn(self) -> None:
        """Each object reconciled once more, and each run's loop running."""
        await asyncio.gather(*(self._resync(key) for key in list(self.seen)))
        for key, body in list(self.seen.items()):
            if key[0] == "trainingruns":
                self._keep_loop(key, body)

    async def _resync(self, key: Key) -> None:
        body = self.seen.get(key)
        if body is None:
            return
        patch = kopf.Patch()
        await self.reconcile(key, copy.deepcopy(body), patch)
        if not patch or key not in self.seen or _changes_nothing(body, patch):
            return
        try:
            await self.kube.patch(path_of(body) + "/status", dict(patch))
        except KubeError as e:
            if e.status != 404:  # 404: deleted meanwhile
                log.warning("writing %s %s/%s's status failed: %s", *key, e)
        except httpx.HTTPError as e:
            log.warning("writing %s %s/%s's status failed: %s", *key, e)

    def _keep_loop(self, key: Key, body: dict[str, Any]) -> None:
        if key in self.stopping:
            return  # the old loop is still ending: never two loops on one run
        loop = self.loops.get(key)
        generation = body["metadata"].get("generation")
        if loop is not None and not loop.task.done():
            if loop.generation != generation:
                # Its spec changed (a knob): the loop ends and the next turn starts one
                # with the new settings, rebuilding its view as after an operator restart.
                log.info("TrainingRun %s/%s changed; its control loop restarts", *key[1:])
                self._stop(key)
            return
        if loop is not None and not loop.task.cancelled() and loop.task.exception():
            exc = loop.task.exception()
            log.error("the control loop of %s/%s failed: %r", key[1], key[2], exc, exc_info=exc)
        stopped = Stopped()
        task = asyncio.get_running_loop().create_task(
            self.control(body, stopped), name=f"control {key[1]}/{key[2]}"
        )
        self.loops[key] = Loop(task, stopped, generation)

    def _stop(self, key: Key) -> None:
        loop = self.loops.pop(key, None)
        if loop is None or loop.task.done():
            return
        task = asyncio.get_running_loop().create_task(self._end(loop))
        self.stopping[key] = task
        task.add_done_callback(lambda _: self.stopping.pop(key, None))

    async def _end(self, loop: Loop) -> None:
        loop.stopped.set()
        done, _ = await asyncio.wait({loop.task}, timeout=self.stop_timeout_s)
        if not done:
            loop.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await loop.task

    async def aclose(self) -> None:
        """The resync ended; every loop asked to stop, and waited for (then cancelled)."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        for key in list(self.loops):
            self._stop(key)
        if self.stopping:
            await asyncio.wait(set(self.stopping.values()))


def _changes_nothing(body: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether a merge patch of the status would leave `body` as it is: a resync of a
    pool at rest then writes nothing (one status write per object per resync was most
    of a steady resync's requests)."""
    status = body.get("status") or {}
    return set(patch) <= {"status"} and all(
        status.get(field) == value for field, value in (patch.get("status") or {}).items()
    )
