"""What the operator's reconcilers share: the status and condition helpers, how an
invalid resource is refused (`Invalid`), and `ReconcilerBase`, the state every reconciler
works with (the API client, how it reaches workers and trainers, its Events and metrics).
One reconciler a kind builds on it: `pools`, `groups`, `runs`."""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from cadence.common.clock import loop_time
from cadence.common.complaints import first_complaint
from cadence.operator.api.resources import (
    API_VERSION,
    RolloutPool,
    TrainingRun,
    as_written,
)
from cadence.operator.kube import children
from cadence.operator.kube.client import KubeApi, path, path_of
from cadence.operator.kube.events import EventRecorder, Post
from cadence.operator.kube.metrics import OperatorMetrics

log = logging.getLogger("cadence.operator")

Status = dict[str, Any]
Events = list[tuple[str, str]]  # (reason, message) for the handler to publish
# Reasons that announce a state: once per entry into it.
STATES = {"Waiting", "Invalid", "ReconcileError"}
WARNINGS = {"Invalid", "ReconcileError"}


def pod_endpoint(pod: Mapping[str, Any]) -> str | None:
    """A worker pod's control URL: its IP over HTTP, its Service name over TLS."""
    return children.pod_url(pod)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, true: bool, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if true else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": _now(),
    }


def settled(
    before: Sequence[Mapping[str, Any]],
    after: list[dict[str, Any]],
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """`after`, each condition keeping its earlier lastTransitionTime where its status
    did not change (the time says when it became so, not when it was last checked), and
    saying which generation of the spec it was observed on."""
    old = {c.get("type"): c for c in before}
    out = []
    for new in after:
        prev = old.get(new["type"]) or {}
        kept = prev.get("status") == new["status"] and "lastTransitionTime" in prev
        c = {**new, "lastTransitionTime": prev["lastTransitionTime"]} if kept else dict(new)
        if generation is not None:
            c["observedGeneration"] = generation
        out.append(c)
    return out


class Invalid(Exception):
    """A resource its model refuses; the message names the field and the reason."""


def validated(model: type[BaseModel], body: Mapping[str, Any]) -> Any:
    obj = as_written(body)
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        where, message = first_complaint(e, obj, model)
        raise Invalid(f"{where}: {message}" if where else message) from None


def waiting_status(
    body: Mapping[str, Any], reason: str, message: str, events: Events, *, stuck: bool
) -> Status:
    """A run that cannot start: Degraded when only a change of the cluster can let it
    (its pool is missing), not when it waits its turn (its pool serves another run)."""
    events.append(("Waiting", message))
    return {
        "phase": "Waiting",
        "conditions": [
            condition("Ready", False, reason, message),
            condition("Progressing", False, reason, message),
            condition("Degraded", stuck, reason if stuck else "Valid", message),
        ],
    }


def pool_conditions(ready: int, desired: int, *, serving: bool) -> list[dict[str, Any]]:
    """Ready and Progressing of a pool. Its workers run only while it serves a run: an
    idle pool is said to be idle, not to be scaling towards workers it will not start."""
    if not serving:
        said = "no TrainingRun is bound; the workers start with one"
        return [
            condition("Ready", False, "Idle", said),
            condition("Progressing", False, "Idle", said),
        ]
    said = f"{ready} of {desired} workers ready"
    return [
        condition("Ready", ready == desired and desired > 0, "Workers", said),
        condition(
            "Progressing", ready != desired, "Scaling" if ready != desired else "Settled", said
        ),
    ]


@dataclass
class ReconcilerBase:
    kube: KubeApi
    endpoint: Callable[[Mapping[str, Any]], str | None] = pod_endpoint
    trainer_endpoint: Callable[[TrainingRun, RolloutPool | None], str] = children.trainer_url
    status_every_s: float = 2.0  # a run's status is patched at most this often
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    # How clients reach workers and trainers (tests route them in-process; None: network).
    transport: httpx.AsyncBaseTransport | None = None
    post: Post = field(init=False)  # Events about its objects
    # The runs whose control loop is running now (waiting for its pool or trainer too).
    controlling: set[tuple[str, str]] = field(default_factory=set)
    # Why a run's control loop could not start, as last logged (logged again on a change).
    waiting: dict[tuple[str, str], str] = field(default_factory=dict)
    # Whose calls the workers' NetworkPolicy admits: the operator's pods (this namespace)
    # and Prometheus (that one).
    operator_namespace: str = "cadence-system"
    # The time every wait and rate of the operator is read on: a test's fake clock, or
    # the event loop's real one.
    clock: Callable[[], float] = loop_time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    scrapers_namespace: str = "monitoring"
    # Where run traces are written (`<namespace>/<run>-<uid>.jsonl`); None: nowhere.
    trace_dir: Path | None = None

    def __post_init__(self) -> None:
        self.post = EventRecorder(self.kube)

    async def aclose(self) -> None:
        if isinstance(self.post, EventRecorder):
            await self.post.drain()

    async def _ensure_spec(self, obj: Mapping[str, Any]) -> None:
        """Create `obj`, or bring an existing one's spec to `obj`'s: for objects only the
        operator writes, whose spec follows the pool (a group turned to vLLM opens KV
        ports)."""
        existing, created = await self.kube.ensure(obj)
        if not created and existing.get("spec") != obj["spec"]:
            await self.kube.patch(path_of(obj), {"spec": obj["spec"]})

    def _pool_url(self, namespace: str, name: str | None = None) -> str:
        return path(API_VERSION, "rolloutpools", namespace, name)

    async def _release(self, ns: str, pool_name: str, events: Events) -> None:
        await self.kube.patch(self._pool_url(ns, pool_name) + "/status", {"status": {"run": None}})
        events.append(("Released", f"RolloutPool {pool_name}"))

    async def _token(self, ns: str, secret_name: str) -> str | None:
        """The pool's bearer token, from the Secret the pool's handler made."""
        secret = await self.kube.get(path("v1", "secrets", ns, secret_name))
        if secret is None:
            return None
        encoded = (secret.get("data") or {}).get(children.TOKEN_KEY)
        try:
            token = base64.b64decode(encoded, validate=True).decode() if encoded else ""
        except (ValueError, UnicodeDecodeError):
            token = ""
        if not token.strip():
            raise Invalid(
                f"Secret {secret_name} holds no bearer token under the key "
                f"{children.TOKEN_KEY!r}: add one, or delete the Secret for the operator to "
                "make it"
            )
        return token
