"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does.

Two operator replicas must not both reconcile: each would make pods and run a control
loop per run, and two loops on one pool place every trajectory twice. kopf's peering
pauses every operator of equal priority rather than electing one, so the replicas
elect a leader here and only the leader runs kopf; the others wait, ready to take over.

The rules are client-go's. A candidate takes the Lease when nobody holds it, or when
the holder's record (holder, renewTime) has not changed for `duration_s` as measured on
the candidate's own clock (so no two machines' clocks are compared). Every write carries
the resourceVersion it read (a JSON patch `test`), so of two candidates writing at once,
one wins. The leader renews every `retry_s`; if it cannot for `renew_deadline_s`, it
has lost and stops (the process exits and restarts as a candidate). A leader that stops
cleanly releases the Lease, so a standby takes over at its next try, not a lease later.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from cadence.common.clock import loop_time
from cadence.operator.kube.client import Kube, KubeError, path

log = logging.getLogger("cadence.operator")

LEASE_NAME = "cadence-operator"


def identity() -> str:
    """This process's name in the Lease: its pod's name (the hostname) and a nonce, so a
    restarted container is a new candidate."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    kube: Kube
    namespace: str
    identity: str = field(default_factory=identity)
    name: str = LEASE_NAME
    duration_s: float = 15.0  # a standby takes over this long after the last renewal
    renew_deadline_s: float = 10.0  # a leader that cannot renew for this long stops
    retry_s: float = 2.0
    clock: Callable[[], float] = loop_time
    leading: bool = False
    observed: tuple[Any, Any] | None = None  # (holder, renewTime) as last read
    observed_at: float = 0.0

    @property
    def url(self) -> str:
        return path("coordination.k8s.io/v1", "leases", self.namespace, self.name)

    def _observe(self, spec: dict[str, Any]) -> None:
        record = (spec.get("holderIdentity"), spec.get("renewTime"))
        if record != self.observed:
            self.observed, self.observed_at = record, self.clock()

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; whether this process holds the Lease now."""
        now = _now()
        lease = await self.kube.get(self.url)
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration_s)),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        }
        if lease is None:
            try:
                await self.kube.create(
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace},
                        "spec": spec,
                    }
                )
            except KubeError as e:
                if e.status == 409:  # another candidate made it first
                    return self._lost()
                raise
            return self._won(spec)
        old: dict[str, Any] = lease.get("spec") or {}
        self._observe(old)
        holder = old.get("holderIdentity")
        if holder and holder != self.identity and self.clock() - self.observed_at < self.duration_s:
            return self._lost()
        transitions = int(old.get("leaseTransitions") or 0)
        if holder == self.identity:
            spec["acquireTime"] = old.get("acquireTime", now)
            spec["leaseTransitions"] = transitions
        else:
            spec["leaseTransitions"] = transitions + 1
        version = lease["metadata"]["resourceVersion"]
        try:
            await self.kube.json_patch(
                self.url,
                [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": version},
                    {"op": "add", "path": "/spec", "value": spec},
                ],
            )
        except KubeError as e:
            if e.status in (409, 422):  # written meanwhile: someone else's turn
                return self._lost()
            raise
        return self._won(spec)

    def _won(self, spec: dict[str, Any]) -> bool:
        if not self.leading:
            log.info("leading as %s (Lease %s/%s)", self.identity, self.namespace, self.name)
        self.leading = True
        self._observe(spec)
        return True

    def _lost(self) -> bool:
        if self.leading:
            log.error("lost the Lease %s/%s to %s", self.namespace, self.name, self.observed)
        self.leading = False
        return False

    async def _attempt(self) -> bool:
        try:
            return await self.try_acquire_or_renew()
        except (KubeError, httpx.HTTPError) as e:
            log.warning("the Lease %s/%s: %s", self.namespace, self.name, e)
            return False

    async def acquire(self) -> None:
        """Returns once this process leads."""
        log.info("waiting to lead (Lease %s/%s) as %s", self.namespace, self.name, self.identity)
        while not await self._attempt():
            await asyncio.sleep(self.retry_s)

    async def hold(self) -> None:
        """Renews while leading; returns when leadership is lost (another holder, or no
        renewal for `renew_deadline_s`)."""
        renewed = self.clock()
        while True:
            await asyncio.sleep(self.retry_s)
            if await self._attempt():
                renewed = self.clock()
            elif self.observed is not None and self.observed[0] not in (None, self.identity):
                return  # someone else holds it
            elif self.clock() - renewed > self.renew_deadline_s:
                log.error("could not renew the Lease for %.0f s", self.clock() - renewed)
                self.leading = False
                return

    async def release(self) -> None:
        """Gives the Lease up, so a standby takes it at its next try."""
        if not self.leading:
            return
        self.leading = False
        lease = await self.kube.get(self.url)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        try:
            await self.kube.json_patch(
                self.url,
                [
                    {
                        "op": "test",
                        "path": "/metadata/resourceVersion",
                        "value": lease["metadata"]["resourceVersion"],
                    },
                    {"op": "replace", "path": "/spec/holderIdentity", "value": ""},
                    {"op": "replace", "path": "/spec/leaseDurationSeconds", "value": 1},
                ],
            )
        except (KubeError, httpx.HTTPError) as e:
            log.warning("releasing the Lease: %s", e)
        else:
            log.info("released the Lease %s/%s", self.namespace, self.name)
