"""A small async client for the Kubernetes API: the few verbs the operator's handlers
use on the objects it owns (get, list, create, merge-patch, delete), with JSON bodies.

Kopf watches and calls the handlers; it has no public client for writing other
objects, so this is that client. Lists filter by labels on this side as well as asking
the server to, so it behaves the same against the test emulator, which ignores label
selectors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx
import kopf

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def status_message(text: str) -> str:
    """What the API server said: a Status object's `message` (the sentence a person
    reads, e.g. "spec.replicas: Invalid value: 9: must be <= 4"), else the body, cut."""
    try:
        body = json.loads(text)
    except ValueError:
        return text[:300]
    message = body.get("message") if isinstance(body, dict) else None
    return message if isinstance(message, str) and message else text[:300]


def path(api_version: str, plural: str, namespace: str | None, name: str | None = None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{where}/{plural}" + (f"/{name}" if name else "")


PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "Secret": "secrets",
    "ConfigMap": "configmaps",
    "StatefulSet": "statefulsets",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "NetworkPolicy": "networkpolicies",
    "Event": "events",
    "Lease": "leases",
    "RolloutGroup": "rolloutgroups",
    "RolloutPool": "rolloutpools",
    "TrainingRun": "trainingruns",
}


def path_of(obj: Mapping[str, Any], name: bool = True) -> str:
    meta = obj["metadata"]
    return path(
        obj["apiVersion"],
        PLURALS[obj["kind"]],
        meta.get("namespace"),
        meta["name"] if name else None,
    )


class KubeApi(Protocol):
    """What the handlers need of the Kubernetes API: these six verbs on the objects the
    operator owns. `Kube` speaks them over HTTP; tests give an in-memory one."""

    async def get(self, url: str) -> dict[str, Any] | None: ...

    async def list(
        self, url: str, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]: ...

    async def ensure(self, obj: Mapping[str, Any]) -> tuple[dict[str, Any], bool]: ...

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    async def patch(self, url: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def delete(self, url: str) -> bool: ...


# What a client retries, with backoff: the API server shedding load (429, honouring its
# Retry-After) or briefly unavailable (5xx, a dropped connection), as client-go does.
RETRIED = {429, 500, 502, 503, 504}
TRIES = 5
BACKOFF_S = 0.25  # doubled each try: 0.25, 0.5, 1, 2 s
MAX_WAIT_S = 10.0


class Kube:
    """`KubeApi` over HTTP. `connect` builds it from kopf's `ConnectionInfo`
    (`credentials.py`: a service account, a kubeconfig's context, an exec plugin);
    `Kube(server)` speaks to a local API server without credentials. Requests the API
    server sheds (429) or fails briefly (5xx, a dropped connection) are retried with
    backoff; conflicts (409) are the caller's: `ensure` reads the winner's object, and
    the Lease's writes are version-guarded and retried on its next turn."""

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        scheme: str | None = None,
        ca: str | Path | None = None,
        insecure: bool = False,
        cert: tuple[str, str] | None = None,
        basic: tuple[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        headers = {"User-Agent": "cadence-operator"}  # audit logs say who
        if token:
            headers["Authorization"] = f"{scheme or 'Bearer'} {token}"
        verify: bool | str = False if insecure else (str(ca) if ca else True)
        self.http = httpx.AsyncClient(
            base_url=server,
            headers=headers,
            verify=verify,
            cert=cert,
            auth=basic,
            timeout=10.0,
            transport=transport,
        )
        self.sleep = sleep

    @classmethod
    def connect(cls, info: kopf.ConnectionInfo) -> Kube:
        cert = None
        if info.certificate_path and info.private_key_path:
            cert = (str(info.certificate_path), str(info.private_key_path))
        basic = (info.username, info.password) if info.username and info.password else None
        return cls(
            info.server,
            token=info.token,
            scheme=info.scheme,
            ca=str(info.ca_path) if info.ca_path else None,
            insecure=bool(info.insecure),
            cert=cert,
            basic=basic,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        for attempt in range(TRIES):
            last = attempt == TRIES - 1
            try:
                response = await self.http.request(method, url, **kw)
            except httpx.TransportError:
                if last:
                    raise
                await self.sleep(BACKOFF_S * 2**attempt)
                continue
            if response.status_code not in RETRIED or last:
                return response
            wait = BACKOFF_S * 2**attempt
            with contextlib.suppress(ValueError):
                wait = float(response.headers.get("Retry-After", wait))
            await self.sleep(min(wait, MAX_WAIT_S))
        raise AssertionError("unreachable")

    async def _send(self, method: str, url: str, body: Any = None, **kw: Any) -> Any:
        response = await self._request(method, url, json=body, **kw)
        if response.status_code >= 400:
            raise KubeError(response.status_code, status_message(response.text))
        return response.json() if response.content else None

    async def get(self, url: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self._send("GET", url)
        except KubeError as e:
            if e.status == 404:
                return None
            raise
        return found

    async def list(self, url: str, labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        params = {}
        if labels:
            params["labelSelector"] = ",".join(f"{k}={v}" for k, v in labels.items())
        items: list[dict[str, Any]] = (await self._send("GET", url, params=params))["items"]
        if labels:
            items = [
                o
                for o in items
                if labels.items() <= (o.get("metadata", {}).get("labels") or {}).items()
            ]
        return items

    async def ensure(self, obj: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create `obj` unless it exists; (the object, whether it was created). An
        existing object is left as it is: its owner may have changed it since."""
        existing = await self.get(path_of(obj))
        if existing is not None:
            return existing, False
        try:
            created: dict[str, Any] = await self._send("POST", path_of(obj, name=False), dict(obj))
        except KubeError as e:
            if e.status != 409:
                raise
            raced = await self.get(path_of(obj))  # made meanwhile by another handler
            if raced is None:
                raise
            return raced, False
        return created, True

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await self._send("POST", path_of(obj, name=False), dict(obj))
        return created

    async def patch(self, url: str, body: Mapping[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/merge-patch+json"}
        patched: dict[str, Any] = await self._send(
            "PATCH", url, content=json.dumps(dict(body)), headers=headers
        )
        return patched

    async def json_patch(self, url: str, ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """A JSON patch (RFC 6902): with a `test` of metadata.resourceVersion, a write
        that only succeeds on the version it was computed from."""
        headers = {"Content-Type": "application/json-patch+json"}
        patched: dict[str, Any] = await self._send(
            "PATCH", url, content=json.dumps(list(ops)), headers=headers
        )
        return patched

    async def delete(self, url: str) -> bool:
        try:
            await self._send("DELETE", url)
        except KubeError as e:
            if e.status == 404:
                return False
            raise
        return True
