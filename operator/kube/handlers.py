"""The operator's reconcilers and their kopf handlers.

Each reconciler reads one resource, validates it with the same pydantic model `cadence
run` uses, makes what it owns exist (`children.py` says what) and returns the status to
write. An invalid resource is not an error to retry: it gets `Degraded` with the field
and the reason, and an Event, and nothing else happens to it or to any other resource.

- RolloutPool: its RolloutGroups (created once; afterwards each group's `replicas` is
  the one owner of its size), the workers' headless Service, the token Secret.
- RolloutGroup: worker pods up to `spec.replicas` while its pool serves a run (a pod
  needs the run's model); above it, pods chosen by `scale_in.choose_for_scale_in` are
  deleted, and their SIGTERM drains them. Status: replicas, ready, the selector /scale
  reports.
- TrainingRun: checks its pool can hold its longest trajectory (`capacity.py`), binds
  the pool (one run per pool; a second waits with a condition saying why), and makes the
  trainer's ConfigMap, StatefulSet and Service. A finished or deleted run releases the
  pool; the groups then retire its workers, and a waiting run binds.

Each TrainingRun's control loop (`loop.py`) runs on the pool's pods, started and stopped
by the supervisor (`supervisor.py`, which also reconciles every object again each resync
period, with no finalizer on any object), and reports it (`run_report.py`): statuses,
Events, the operator's metrics (`metrics.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from cadence.common.errors import describe
from cadence.operator.api.resources import (
    GROUP,
    VERSION,
)
from cadence.operator.kube.events import Post
from cadence.operator.kube.groups import GroupReconciler
from cadence.operator.kube.pools import PoolReconciler
from cadence.operator.kube.reconciling import (
    STATES,
    WARNINGS,
    Events,
    Invalid,
    condition,
    settled,
)
from cadence.operator.kube.runs import RunReconciler
from cadence.operator.kube.supervisor import Supervisor

log = logging.getLogger("cadence.operator")


@dataclass
class Reconciler(PoolReconciler, GroupReconciler, RunReconciler):
    """Every kind's reconciler, over one shared state (`ReconcilerBase`)."""


@dataclass
class Handling:
    """What wraps each reconciler for kopf: its status written with conditions that keep
    their transition times, an invalid object or a failed reconcile said as `Degraded`
    with an Event (once per entry into that state) and a log line, never retried in
    silence; one run per object at a time."""

    reconciler: Reconciler
    post: Post | None = None  # the reconciler's recorder unless a test gives its own
    # A state an object is in (waiting, invalid, failing) is announced when it enters it,
    # not on every retry of its handlers: the last one announced per object.
    said: dict[tuple[str, str, str], tuple[str, str]] = field(default_factory=dict)
    # The resync runs beside kopf's change handlers, not after them: two runs of one
    # object's reconciler at once would both act on what they saw (a group scaled in by
    # its update handler and its resync lost two pods, not one). One at a time.
    busy: defaultdict[tuple[str, str, str], asyncio.Lock] = field(
        default_factory=lambda: defaultdict(asyncio.Lock)
    )
    calls: dict[str, Callable[[Mapping[str, Any], Events], Any]] = field(default_factory=dict)

    def forget(self, key: tuple[str, str, str]) -> None:
        """A deleted object's lock and last announced state go with it."""
        lock = self.busy.get(key)
        if lock is not None and not lock.locked():
            del self.busy[key]
        self.said.pop(key, None)
        self.reconciler.metrics.reconciles.pop(key, None)

    async def reconcile_one(
        self, key: tuple[str, str, str], body: Mapping[str, Any], patch: kopf.Patch
    ) -> None:
        """`key`'s reconciler, as the supervisor's resync calls it."""
        async with self.busy[key]:
            await self.reconcile(key, self.calls[key[0]], body, patch)

    def handler(
        self, kind: str, call: Callable[[Mapping[str, Any], Events], Any]
    ) -> Callable[..., Any]:
        async def handler(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
            key = (kind, body["metadata"].get("namespace", ""), body["metadata"]["name"])
            async with self.busy[key]:
                await self.reconcile(key, call, body, patch)

        return handler

    async def reconcile(
        self,
        key: tuple[str, str, str],
        call: Callable[[Mapping[str, Any], Events], Any],
        body: Mapping[str, Any],
        patch: kopf.Patch,
    ) -> None:
        kind = key[0]
        events: Events = []
        before = (body.get("status") or {}).get("conditions") or []
        generation = body["metadata"].get("generation")
        try:
            status = await call(body, events)
        except Invalid as e:
            patch.status["conditions"] = settled(
                before,
                [
                    condition("Degraded", True, "Invalid", str(e)),
                    condition("Ready", False, "Invalid", str(e)),
                ],
                generation,
            )
            if kind == "trainingruns":
                patch.status["phase"] = "Degraded"
            events = [("Invalid", str(e))]
        except Exception as e:
            # Anything else (the API refused a write, a bug): said on the object and in
            # the log, not retried silently by kopf; the resync tries again.
            log.exception("reconciling %s %s/%s failed", kind, key[1], key[2])
            said = f"reconciling failed, retried every resync: {describe(e)}"
            patch.status["conditions"] = settled(
                before,
                [
                    condition("Degraded", True, "ReconcileError", said),
                    condition("Ready", False, "ReconcileError", said),
                ],
                generation,
            )
            events = [("ReconcileError", said)]
        else:
            if "conditions" in status:
                status["conditions"] = settled(before, status["conditions"], generation)
            patch.status.update(status)
        for reason, message in events:
            if reason in STATES:
                if self.said.get(key) == (reason, message):
                    continue
                self.said[key] = (reason, message)
            (self.post or self.reconciler.post)(body, reason, message, reason in WARNINGS)
            log.info("%s %s/%s: %s: %s", kind, key[1], key[2], reason, message)
        if not any(reason in STATES for reason, _ in events):
            self.said.pop(key, None)
        self.reconciler.metrics.reconciles[key] += 1


def register(
    registry: kopf.OperatorRegistry, reconciler: Reconciler, *, resync_s: float = 5.0
) -> Supervisor:
    """The kopf handlers, on `registry` (tests pass a fresh one): each change reconciles
    its object at once; every event reaches the supervisor, which reconciles every object
    again each `resync_s` seconds (what notices changes no handler is called for:
    a pool released, a run deleted, a pod gone) and runs each run's control loop. None of
    them needs kopf's finalizer, so none is put on Cadence's objects (and one an earlier
    version put is taken off by kopf at the next event)."""
    handling = Handling(reconciler)
    supervisor = Supervisor(
        reconciler.kube,
        handling.reconcile_one,
        reconciler.control,
        handling.forget,
        interval_s=resync_s,
        sleep=reconciler.sleep,
    )

    for plural, call in (
        ("rolloutpools", reconciler.pool),
        ("rolloutgroups", reconciler.group),
        ("trainingruns", reconciler.run),
    ):
        handling.calls[plural] = call
        handler = handling.handler(plural, call)
        resource = (GROUP, VERSION, plural)
        kopf.on.resume(*resource, id=f"{plural}-resume", registry=registry)(handler)
        kopf.on.create(*resource, id=f"{plural}-create", registry=registry)(handler)
        kopf.on.update(*resource, id=f"{plural}-update", field="spec", registry=registry)(handler)
        kopf.on.event(*resource, id=f"{plural}-seen", registry=registry)(_seen(supervisor, plural))

    async def start(**_: Any) -> None:
        supervisor.start()

    async def stop(**_: Any) -> None:
        await supervisor.aclose()
        await reconciler.aclose()

    kopf.on.startup(id="supervisor", registry=registry)(start)
    kopf.on.cleanup(id="supervisor", registry=registry)(stop)
    return supervisor


def _seen(supervisor: Supervisor, plural: str) -> Callable[..., Any]:
    async def seen(body: kopf.Body, type: str | None, **_: Any) -> None:  # in the loop
        supervisor.saw(plural, type, body)

    return seen
