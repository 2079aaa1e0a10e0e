"""Kubernetes Events the operator posts about its objects, through its own client.

kopf's `kopf.info` works only inside a handler kopf called; the operator's resync and
its runs' control loops are its own tasks (`supervisor.py`), so every Event goes out
here, the same way from anywhere. Posting is fire-and-forget, as a recorder's should be:
a reconcile never waits on, or fails for, an Event the API server refused.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from cadence.operator.kube.client import KubeApi, KubeError

log = logging.getLogger("cadence.operator")

COMPONENT = "cadence-operator"

Post = Callable[[Mapping[str, Any], str, str, bool], None]  # body, reason, message, warning

_serial = itertools.count()


def event_for(body: Mapping[str, Any], reason: str, message: str, warning: bool) -> dict[str, Any]:
    """A core/v1 Event about `body`, named as kubelet names its own (object.unique)."""
    meta = body["metadata"]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta['name']}.{time.time_ns():x}{next(_serial):x}",
            "namespace": meta.get("namespace") or "default",
        },
        "involvedObject": {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class EventRecorder:
    """Posts Events with `kube`, each in a task of its own; `drain` waits for those under
    way (an operator stopping posts what it said)."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self.pending: set[asyncio.Task[None]] = set()

    def __call__(self, body: Mapping[str, Any], reason: str, message: str, warning: bool) -> None:
        task = asyncio.get_running_loop().create_task(
            self._post(event_for(body, reason, message, warning))
        )
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _post(self, event: dict[str, Any]) -> None:
        try:
            await self.kube.create(event)
        except (KubeError, httpx.HTTPError) as e:
            log.warning("posting Event %s failed: %s", event["reason"], e)

    async def drain(self) -> None:
        if self.pending:
            await asyncio.wait(set(self.pending), timeout=5.0)
