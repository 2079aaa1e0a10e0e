"""A small async client for the Kubernetes API: the few verbs the operator's handlers
use on the objects it owns (get, list, create, merge-patch, delete), with JSON bodies.

Kopf watches and calls the handlers; it has no public client for writing other
objects, so this is that client. Lists filter by labels on this side as well as asking
the server to, so it behaves the same against the test emulator, which ignores label
selectors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


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


class Kube:
    """`KubeApi` over HTTP, with the service account's token in a pod."""

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        ca: Path | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"User-Agent": "cadence-operator"}  # audit logs say who
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.AsyncClient(
            base_url=server,
            headers=headers,
            verify=str(ca) if ca else True,
            timeout=10.0,
            transport=transport,
        )

    @classmethod
    def in_cluster(cls) -> Kube:
        """From the pod's service account, as every in-cluster client is configured."""
        token = (SERVICE_ACCOUNT / "token").read_text().strip()
        return cls("https://kubernetes.default.svc", token=token, ca=SERVICE_ACCOUNT / "ca.crt")

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _send(self, method: str, url: str, body: Any = None, **kw: Any) -> Any:
        response = await self.http.request(method, url, json=body, **kw)
        if response.status_code >= 400:
            raise KubeError(response.status_code, response.text[:300])
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
        response = await self.http.patch(url, json=dict(body), headers=headers)
        if response.status_code >= 400:
            raise KubeError(response.status_code, response.text[:300])
        patched: dict[str, Any] = response.json()
        return patched

    async def json_patch(self, url: str, ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """A JSON patch (RFC 6902): with a `test` of metadata.resourceVersion, a write
        that only succeeds on the version it was computed from."""
        headers = {"Content-Type": "application/json-patch+json"}
        response = await self.http.patch(url, content=json.dumps(list(ops)), headers=headers)
        if response.status_code >= 400:
            raise KubeError(response.status_code, response.text[:300])
        patched: dict[str, Any] = response.json()
        return patched

    async def delete(self, url: str) -> bool:
        try:
            await self._send("DELETE", url)
        except KubeError as e:
            if e.status == 404:
                return False
            raise
        return True
