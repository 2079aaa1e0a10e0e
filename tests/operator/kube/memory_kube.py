"""The Kubernetes API's six verbs the handlers use (`KubeApi`), over a dict of objects
by path: enough to run a reconciler in-process and read back what it made."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

from cadence.operator.kube.client import KubeError, path_of

_uids = itertools.count(1)
_versions = itertools.count(1)


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """JSON merge patch (RFC 7386): None deletes, objects merge, the rest replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class MemoryKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.scaled: list[tuple[str, int]] = []  # (object, replicas) of each /scale patch

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store `obj` as a user's `kubectl apply` would (with a uid)."""
        stored = copy.deepcopy(dict(obj))
        stored["metadata"].setdefault("uid", f"uid-{next(_uids)}")
        stored["metadata"].setdefault("namespace", "default")
        stored["metadata"].setdefault("generation", 1)
        stored["metadata"]["resourceVersion"] = str(next(_versions))
        self.objects[path_of(stored)] = stored
        return stored

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects.values() if o["kind"] == kind]

    async def get(self, url: str) -> dict[str, Any] | None:
        found = self.objects.get(url)
        return copy.deepcopy(found) if found is not None else None

    async def list(self, url: str, labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for o in self.objects.values()
            if path_of(o, name=False) == url
            and (labels or {}).items() <= (o["metadata"].get("labels") or {}).items()
        ]

    async def ensure(self, obj: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        url = path_of(obj)
        if url in self.objects:
            return copy.deepcopy(self.objects[url]), False
        return copy.deepcopy(self.put(obj)), True

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        if path_of(obj) in self.objects:
            raise KubeError(409, f"{path_of(obj)} already exists")
        return copy.deepcopy(self.put(obj))

    async def patch(self, url: str, body: Mapping[str, Any]) -> dict[str, Any]:
        # Status and scale subresources: a custom resource's scale is its spec.replicas.
        if url.endswith("/status"):
            url = url.removesuffix("/status")
        if url.endswith("/scale"):
            url = url.removesuffix("/scale")
            self.scaled.append((url, body["spec"]["replicas"]))
        if url not in self.objects:
            raise KubeError(404, f"{url} not found")
        # A patch naming a resourceVersion applies only to that version, as the API
        # server's optimistic concurrency has it.
        expected = (body.get("metadata") or {}).get("resourceVersion")
        current = self.objects[url]["metadata"]["resourceVersion"]
        if expected is not None and expected != current:
            raise KubeError(409, f"{url}: the object has been modified")
        merge(self.objects[url], body)
        if "spec" in body:  # as the API server counts changes to the spec
            self.objects[url]["metadata"]["generation"] += 1
        self.objects[url]["metadata"]["resourceVersion"] = str(next(_versions))
        return copy.deepcopy(self.objects[url])

    async def delete(self, url: str) -> bool:
        return self.objects.pop(url, None) is not None
