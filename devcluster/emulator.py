"""An in-memory Kubernetes API server: what the operator's tests and `cadence dev cluster`
run the operator against where no cluster is at hand.

No kube-apiserver runs without etcd and a container runtime on a developer's machine, so
this is `kmock.KubernetesEmulator`, a stateful in-memory Kubernetes API over aiohttp.
kmock 0.8 falls short of what kopf and `kubectl` (v1.32) need, and the subclass below
closes those gaps:

- `/api/v1/namespaces` and `/api/v1/namespaces/NAME` are parsed as Namespace requests
  (kmock reads `namespaces` as the namespace prefix of a resource path); the emulator
  starts with the bundled built-in kinds and a `default` Namespace, which kopf waits for.
- an object created with `generateName` gets a name (kopf's Events do: kmock stores
  them all under no name, so every Event after the first was refused).
- objects get `uid`, `resourceVersion`, `creationTimestamp` and `generation` (and
  `namespace` from the URL); patches bump `resourceVersion`, and `generation` when
  anything but metadata and status changes.
- lists carry `kind`/`apiVersion`/`resourceVersion`; core discovery says
  `groupVersion: v1`, not `/v1`; subresource entries drop the parent's short names and
  categories, and `*/scale` is announced as `autoscaling/v1 Scale`.
- watch streams are served as `application/json`, not octet-stream (kubectl refuses it).
- creating a CustomResourceDefinition registers its resources and marks it Established.
- a request accepting `as=Table` (what `kubectl get` sends) gets a `meta.k8s.io/v1`
  Table rendered from the CRD's `additionalPrinterColumns` (dotted json paths, and a
  filter on a list by one field), which a real API server does and kmock does not.
- deleting an object deletes its dependents (ownerReferences), as the cluster's garbage
  collector does with background propagation; kmock has no collector.
- a pod bound to a node (`spec.nodeName`, which the kubelet stand-in sets) is deleted
  gracefully: it is marked Terminating and stays listed until its kubelet has ended its
  process and deletes it with a grace of 0. kmock removed it at once, so an operator
  took a draining worker for gone while its process still held work.
- every request is recorded (`audit`: user agent, RBAC verb, group, resource), so a test
  can check the operator's ClusterRole allows what the operator does.
- kmock keeps every request it served and, to route the next one, filters that whole
  history once per reaction: each request cost more than the last (1,000 GETs took 31 s,
  the fourth 1,000 took 209 s), so a long session stopped answering. The emulator keeps
  only the last `HISTORY` requests (what it serves does not depend on older ones).
- `/scale` is mapped through the CRD's `specReplicasPath`, `statusReplicasPath` and
  `labelSelectorPath`: GET returns an `autoscaling/v1` Scale, PATCH/PUT of
  `spec.replicas` writes the object's replicas field.
- a JSON patch whose `test` fails (kopf tests `resourceVersion` when it patches
  finalizers and annotations) is refused with 422, as kube-apiserver refuses it; kmock
  answered 500, on which kopf re-sent the same stale patch up to 9 times with back-off,
  stalling that object's handling (seen once objects were written every fraction of a
  second).

- `/openapi/v3` serves, per CRD version, a document whose PATCH operation takes
  `fieldValidation` and whose components hold the CRD's schema: enough for `kubectl
  apply` to validate on the server (its default `--validate=strict`); a create or
  update with `fieldValidation=Strict` naming a field the schema lacks is refused with
  400 and kube-apiserver's "strict decoding error", where pruning would drop it.
- custom resources are admitted as kube-apiserver admits them (`_admit`): defaults,
  pruning, the schema and CEL rules (422 naming each field), `/status` a subresource.

Still missing: label and field selectors, server-side apply, protobuf bodies (refused
with 415: `kubectl create secret ...` sends them), OpenAPI v2 and built-in kinds'
schemas, PUT of whole objects, CRD deletion unregistering resources.

`serve()` runs an emulator on 127.0.0.1 in a thread with its own event loop, so that
synchronous tests, `kubectl` and a kopf operator in yet another thread can all use it;
`write_kubeconfig()` points `kubectl` at it; `call()` is a small JSON client for tests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import datetime
import json
import re
import threading
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal.dicts import patch_dict

from .openapi import apply_defaults, prune, refusals, unknown

CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NAMESPACES = kmock.resource("", "v1", "namespaces")
VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
NAME_COLUMN = {"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}
AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
HISTORY = 16  # requests kmock remembers (its routing rescans them all per request)
_NAMESPACE_PATH = re.compile(r"/api/v1/namespaces(?:/([^/]+))?/?")
_ALL = "/api/v1/namespaces/*"
_VERBS = {
    kmock.action.FETCH: "get",
    kmock.action.LIST: "list",
    kmock.action.WATCH: "watch",
    kmock.action.CREATE: "create",
    kmock.action.UPDATE: "patch",
    kmock.action.DELETE: "delete",
}
_SCALE_WRITES = {kmock.method.PATCH, kmock.method.PUT}
_WRITES = {
    kmock.method.POST: kmock.action.CREATE,
    kmock.method.PATCH: kmock.action.UPDATE,
    kmock.method.DELETE: kmock.action.DELETE,
}
_STORES = set(_WRITES.values())


@attrs.define(kw_only=True)
class KubernetesEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the gaps named in the module docstring closed."""

    _revision: int = attrs.field(default=0, init=False)
    # (User-Agent, RBAC verb, API group, resource[/subresource]) of every request.
    audit: list[tuple[str, str, str, str]] = attrs.field(factory=list, init=False)
    # Who waits for the next write (`written`), in the loop that serves the emulator.
    _waiting: list[asyncio.Future[None]] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # Above kmock's own fallback for watches, below anything a test declares.
        watch = (self.fallback**1)[kmock.action.WATCH]
        watch << kmock.headers({"Content-Type": "application/json"}) << self._serve_watch
        with warnings.catch_warnings():  # kmock reads its bundle with a deprecated call
            warnings.simplefilter("ignore", DeprecationWarning)
            self.resources.load_bundled()
        self.objects[NAMESPACES, None, "default"] = self._stamp(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}
        )

    # --- requests: fix the parsing, stamp the metadata, then let kmock store them ---

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock fails to parse the bare /api/v1/namespaces (it takes "namespaces" for the
        # prefix of a namespaced path): hand it over as /api/v1/namespaces/*, which kmock
        # parses as a namespace "*" and _reparse() reads back as the collection.
        if raw_request.path.startswith("/openapi/v3"):
            return self._serve_openapi(raw_request.path.removeprefix("/openapi/v3").strip("/"))
        if raw_request.content_type == "application/vnd.kubernetes.protobuf":
            # `kubectl create secret ...` and the like send built-in kinds as protobuf,
            # which kmock cannot read (it failed with a 500 AttributeError).
            return _failure(
                415,
                "UnsupportedMediaType",
                "this emulator reads JSON only: write the object as YAML and "
                "`kubectl apply --validate=false -f` it",
            )
        if raw_request.path.rstrip("/") == "/api/v1/namespaces":
            rel_url = raw_request.rel_url.with_path(_ALL).with_query(raw_request.query)
            raw_request = raw_request.clone(rel_url=rel_url)
        self._forget()
        return await super().__call__(raw_request)

    def _forget(self) -> None:
        """Before kmock records a request: keep the last `HISTORY` - 1, kmock's and each
        reaction's."""
        for kept in (self._requests, *(p._requests for p in self._payloads)):
            del kept[: max(0, len(kept) - HISTORY + 1)]

    @property
    def remembered(self) -> int:
        """How many requests kmock holds now."""
        return len(self._requests)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        self._reparse(request)
        self._record(request)
        if request.subresource == "scale" and request.method in _SCALE_WRITES:
            _amend(request, action=kmock.action.UPDATE, data=self._scale_to_object_patch(request))
        refused = self._admit(request)
        if refused is not None:
            return refused
        if request.action == kmock.action.DELETE:
            held = await self._terminate_gracefully(request)
            if held is not None:
                return held
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            self._stamp(request.data, namespace=request.namespace)
            if request.resource == CRDS:
                self._register_crd(request.data)
        elif request.action == kmock.action.UPDATE:
            try:
                self._stamp_patch(request)
            except jsonpatch.JsonPatchTestFailed as e:
                return _failure(422, "Invalid", f"the patch's test failed: {e}")
        response = await super()._handle(request)
        if request.action in {kmock.action.DELETE, kmock.action.UPDATE}:
            await self._collect_garbage()
        if request.action in _STORES:
            for waiter in self._waiting:
                if not waiter.done():
                    waiter.set_result(None)
            self._waiting.clear()
        return response

    async def written(self) -> None:
        """Return once the emulator has served its next write: what a test in the loop that
        serves it waits on instead of polling the API."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        await waiter

    def _admit(self, request: kmock.Request) -> aiohttp.web.Response | None:
        """What kube-apiserver does to a custom resource before storing it: a write to
        `/status` changes only status, any other write leaves status as it was (the
        status subresource); schema defaults are applied and unknown fields pruned; the
        result is checked against the CRD's schema and CEL rules (transition rules with
        the stored object), and refused with 422 naming each field. The request is
        rewritten so kmock stores exactly that result."""
        creating = request.action == kmock.action.CREATE
        if request.resource is None or not (creating or request.action == kmock.action.UPDATE):
            return None
        version = self._crd_version(request.resource)
        if version is None or request.subresource not in (None, "status", "scale"):
            return None
        schema = version["schema"]["openAPIV3Schema"]
        has_status = "status" in (version.get("subresources") or {})
        old: dict[str, Any] | None = None
        if creating:
            if not isinstance(request.data, dict):
                return None
            new = copy.deepcopy(request.data)
            if has_status:
                new.pop("status", None)
        else:
            if request.name is None:
                return None
            try:
                old = self.objects[request.resource, request.namespace, request.name].raw
            except (KeyError, ValueError):
                return None  # kmock answers 404
            try:
                new = dict(patch_dict(copy.deepcopy(old), request.data))
            except jsonpatch.JsonPatchTestFailed as e:
                return _failure(422, "Invalid", f"the patch's test failed: {e}")
            if has_status and request.subresource == "status":
                new = {**copy.deepcopy(old), "status": new.get("status")}
                if new["status"] is None:
                    del new["status"]
            elif has_status:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
        meta = new.get("metadata", {})
        strict = request.params.get("fieldValidation") == "Strict"
        extra = [f for f in unknown(schema, new) if not f.startswith(("metadata", "status"))]
        if strict and extra:
            kind = self.resources[request.resource].kind
            said = ", ".join(f'unknown field "{f}"' for f in extra)
            version_name = request.resource.version
            message = (
                f'{kind} in version "{version_name}" cannot be handled as a {kind}: '
                f"strict decoding error: {said}"
            )
            return _failure(400, "BadRequest", message)
        new = prune(schema, apply_defaults(schema, new))
        new["metadata"] = meta
        found = refusals(schema, new, old)
        if found:
            kind = self.resources[request.resource].kind
            name = meta.get("name") or meta.get("generateName", "")
            causes = [{"field": field, "message": message} for field, message in found]
            said = ", ".join(f"{field}: {message}" for field, message in found)
            details = {
                "name": name,
                "group": request.resource.group,
                "kind": request.resource.plural,
                "causes": causes,
            }
            message = f'{kind}.{request.resource.group} "{name}" is invalid: {said}'
            return _failure(422, "Invalid", message, details)
        if creating:
            request.data.clear()
            request.data.update(new)
        else:
            assert old is not None
            _amend(request, data=_merge_diff(old, new))
        return None

    async def _terminate_gracefully(
        self, request: kmock.Request
    ) -> aiohttp.web.StreamResponse | None:
        """kube-apiserver's graceful deletion: a pod bound to a node (`spec.nodeName`)
        is only marked (`deletionTimestamp`, `deletionGracePeriodSeconds`) and stays,
        Terminating, until its kubelet has ended its process and deletes it with a grace
        of 0. Its name stays taken meanwhile, and whoever lists pods still sees it."""
        resource = request.resource
        name = request.name
        if resource is None or resource.group != "" or resource.plural != "pods" or not name:
            return None
        try:
            obj = self.objects[resource, request.namespace, name]
        except (KeyError, ValueError):
            return None
        pod = obj.raw
        grace = _grace_s(request, pod)
        if not pod.get("spec", {}).get("nodeName") or grace == 0:
            return None
        if not pod["metadata"].get("deletionTimestamp"):
            _mark_terminating(obj, grace)
            await self._buses[resource].put({"type": "MODIFIED", "object": obj.raw})
        return aiohttp.web.json_response(obj.raw)

    async def _collect_garbage(self) -> None:
        """kube-controller-manager's garbage collector, background propagation: an object
        all of whose owners (by uid) are gone is deleted in turn, its finalizers honoured
        (marked with a deletionTimestamp), until nothing more goes."""
        async with self._lock:
            while True:
                live = [(key, obj) for key, obj in self._objects.items() if not obj.deleted]
                uids = {obj.get("metadata", {}).get("uid") for _, obj in live}
                orphans = [
                    (key, obj)
                    for key, obj in live
                    if (refs := obj.get("metadata", {}).get("ownerReferences"))
                    and not any(ref.get("uid") in uids for ref in refs)
                    and not obj.get("metadata", {}).get("deletionTimestamp")
                ]
                if not orphans:
                    return
                for (resource, _, _), obj in orphans:
                    if obj.get("metadata", {}).get("finalizers"):
                        obj.patch({"metadata": {"deletionTimestamp": _now()}})
                        event = {"type": "MODIFIED", "object": obj.raw}
                    elif resource.plural == "pods" and obj.get("spec", {}).get("nodeName"):
                        _mark_terminating(obj, _pod_grace_s(obj.raw))
                        event = {"type": "MODIFIED", "object": obj.raw}
                    else:
                        obj.delete()
                        event = {"type": "DELETED", "object": obj.last.raw}
                    await self._buses[resource].put(event)

    def _record(self, request: kmock.Request) -> None:
        """The audit log: who asked for which verb on which resource, as RBAC names them."""
        if request.resource is None or request.resource.plural is None or request.action is None:
            return  # discovery, which every authenticated client may read
        verb = _VERBS.get(request.action, str(request.action))
        if verb == "delete" and request.name is None:
            verb = "deletecollection"
        if verb == "patch" and request.method == kmock.method.PUT:
            verb = "update"
        plural = str(request.resource.plural)
        if request.subresource:
            plural += f"/{request.subresource}"
        agent = request.headers.get("User-Agent", "")
        self.audit.append((agent, verb, str(request.resource.group), plural))

    def _reparse(self, request: kmock.Request) -> None:
        """Read /api/v1/namespaces[/NAME] as Namespace requests, not as a namespace prefix."""
        match = _NAMESPACE_PATH.fullmatch(request.url.path)
        if match is None:
            return
        name = None if match.group(1) in {None, "*"} else match.group(1)
        action: kmock.action | None
        if request.method != kmock.method.GET:
            action = _WRITES.get(request.method)
        elif request.params.get("watch") in {"true", "1"}:
            action = kmock.action.WATCH
        else:
            action = kmock.action.FETCH if name else kmock.action.LIST
        _amend(request, resource=NAMESPACES, namespace=None, name=name, action=action)

    def _stamp(self, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if namespace is not None:
            meta.setdefault("namespace", namespace)
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = self._next_revision()
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        return body

    def _stamp_patch(self, request: kmock.Request) -> None:
        if request.resource is None or request.name is None:
            return
        try:
            old = self.objects[request.resource, request.namespace, request.name].raw
        except (KeyError, ValueError):
            return  # kmock answers 404
        new = dict(patch_dict(copy.deepcopy(old), request.data))
        generation = old["metadata"].get("generation", 1)
        if _desired(new) != _desired(old):
            generation += 1
        stamp = {"resourceVersion": self._next_revision(), "generation": generation}
        if isinstance(request.data, dict):
            request.data.setdefault("metadata", {}).update(stamp)
        elif isinstance(request.data, list):  # a JSON patch
            for key, value in stamp.items():
                request.data.append({"op": "add", "path": f"/metadata/{key}", "value": value})

    def _next_revision(self) -> str:
        self._revision += 1
        return str(self._revision)

    def _register_crd(self, crd: dict[str, Any]) -> None:
        spec, names = crd["spec"], crd["spec"]["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            self.resources[kmock.resource(spec["group"], version["name"], names["plural"])] = (
                kmock.ResourceInfo(
                    kind=names["kind"],
                    singular=names.get("singular", names["kind"].lower()),
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    shortnames=names.get("shortNames", []),
                    categories=names.get("categories", []),
                    verbs=VERBS,
                    subresources=version.get("subresources", {}).keys(),
                )
            )
        conditions = [
            {"type": kind, "status": "True", "reason": kind, "lastTransitionTime": _now()}
            for kind in ("NamesAccepted", "Established")
        ]
        crd["status"] = {"acceptedNames": names, "conditions": conditions}

    def _crd_version(self, resource: kmock.resource) -> dict[str, Any] | None:
        """The stored CRD's entry for this resource's version, None for built-in kinds."""
        try:
            crd = self.objects[CRDS, None, f"{resource.plural}.{resource.group}"].raw
        except (KeyError, ValueError):
            return None
        versions = [v for v in crd["spec"]["versions"] if v["name"] == resource.version]
        return dict(versions[0]) if versions else None

    # --- responses: what kmock serves, completed ---

    def _serve_openapi(self, group_version: str) -> aiohttp.web.Response:
        """OpenAPI v3, as far as `kubectl apply` reads it: the index of group versions,
        and for each served CRD version a document whose PATCH operation takes
        `fieldValidation` (so kubectl validates on the server, `--validate=strict`) and
        whose components hold the CRD's schema."""
        documents: dict[str, dict[str, Any]] = {}
        for key, obj in list(self._objects.items()):
            if key[0] != CRDS or obj.deleted:
                continue
            spec = obj.raw["spec"]
            for version in spec["versions"]:
                gv = f"apis/{spec['group']}/{version['name']}"
                doc = documents.setdefault(gv, {"openapi": "3.0.0", "paths": {}})
                gvk = {"group": spec["group"], "version": version["name"]}
                gvk["kind"] = spec["names"]["kind"]
                scope = "/namespaces/{namespace}" if spec.get("scope") != "Cluster" else ""
                path = f"/{gv}{scope}/{spec['names']['plural']}/{{name}}"
                validation: dict[str, Any] = {"name": "fieldValidation", "in": "query"}
                validation["schema"] = {"type": "string"}
                doc["paths"][path] = {
                    "patch": {
                        "x-kubernetes-group-version-kind": gvk,
                        "parameters": [validation],
                        "responses": {"200": {"description": "OK"}},
                    }
                }
                reverse = ".".join(reversed(spec["group"].split(".")))
                name = f"{reverse}.{gvk['version']}.{gvk['kind']}"
                schema = {**version["schema"]["openAPIV3Schema"]}
                schema["x-kubernetes-group-version-kind"] = [gvk]
                doc.setdefault("components", {"schemas": {}})["schemas"][name] = schema
        if not group_version:
            index = {gv: {"serverRelativeURL": f"/openapi/v3/{gv}"} for gv in documents}
            return aiohttp.web.json_response({"paths": index})
        if group_version not in documents:
            return _failure(404, "NotFound", f"no OpenAPI document for {group_version}")
        return aiohttp.web.json_response(documents[group_version])

    async def _serve_version(self, request: kmock.Request) -> kmock.Payload:
        payload = await super()._serve_version(request)
        assert isinstance(payload, dict) and request.resource is not None
        if request.resource.group == "":
            payload["groupVersion"] = request.resource.version
        for entry in payload["resources"]:
            if "/" in entry["name"]:
                entry.update(shortNames=[], categories=[])
            if entry["name"].endswith("/scale"):
                entry.update(group="autoscaling", version="v1", kind="Scale")
        return payload

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        payload = await super()._serve_list(request)
        assert isinstance(payload, dict) and request.resource is not None
        if _wants_table(request):
            return self._table(request.resource, payload["items"])
        resource = request.resource
        known = self.resources[resource].kind if resource in self.resources else None
        kind = known or str(resource.plural).title()
        group_version = f"{resource.group}/{resource.version}".lstrip("/")
        return {
            "kind": f"{kind}List",
            "apiVersion": group_version,
            "metadata": {"resourceVersion": str(self._revision)},
            "items": payload["items"],
        }

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
        # kmock replays every object as ADDED: skip those the client has seen (a list's
        # resourceVersion), and render objects as Tables for `kubectl get --watch`.
        assert request.resource is not None
        seen = int(request.params.get("resourceVersion") or 0)
        async for event in super()._serve_watch(request):
            if not isinstance(event, dict):  # the empty chunk that starts the stream
                yield event
                continue
            obj = event["object"]
            revision = int(obj.get("metadata", {}).get("resourceVersion") or 0)
            if event["type"] == "ADDED" and revision <= seen:
                continue
            if _wants_table(request):
                obj = self._table(request.resource, [obj])
            yield {"type": event["type"], "object": obj}

    async def _serve_fetch(self, request: kmock.Request) -> kmock.Payload:
        payload = await super()._serve_fetch(request)
        assert isinstance(payload, dict) and request.resource is not None
        if request.subresource == "scale":
            return self._scale(request.resource, payload)
        if _wants_table(request):
            return self._table(request.resource, [payload])
        return payload

    async def _serve_update(self, request: kmock.Request) -> kmock.Payload:
        payload = await super()._serve_update(request)
        assert isinstance(payload, dict) and request.resource is not None
        if request.subresource == "scale":
            return self._scale(request.resource, payload)
        return payload

    def _table(self, resource: kmock.resource, objects: list[dict[str, Any]]) -> dict[str, Any]:
        version = self._crd_version(resource) or {}
        columns = version.get("additionalPrinterColumns") or [AGE_COLUMN]
        definitions = [NAME_COLUMN] + [
            {
                "name": column["name"],
                "type": column["type"],
                "format": column.get("format", ""),
                "description": column.get("description", ""),
                "priority": column.get("priority", 0),
            }
            for column in columns
        ]
        rows = [
            {
                "cells": [obj["metadata"]["name"]] + [_cell(column, obj) for column in columns],
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj["metadata"],
                },
            }
            for obj in objects
        ]
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(self._revision)},
            "columnDefinitions": definitions,
            "rows": rows,
        }

    # --- /scale through the CRD's scale paths ---

    def _scale_paths(self, resource: kmock.resource) -> dict[str, str]:
        scale = (self._crd_version(resource) or {}).get("subresources", {}).get("scale")
        if scale is None:
            raise kmock.KubernetesNotFoundError(message=f"{resource.plural} has no /scale")
        return dict(scale)

    def _scale(self, resource: kmock.resource, obj: dict[str, Any]) -> dict[str, Any]:
        paths = self._scale_paths(resource)
        meta = obj["metadata"]
        kept = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
        status: dict[str, Any] = {"replicas": _lookup(obj, paths["statusReplicasPath"]) or 0}
        selector = _lookup(obj, paths.get("labelSelectorPath", ""))
        if selector is not None:
            status["selector"] = selector
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {key: meta[key] for key in kept if key in meta},
            "spec": {"replicas": _lookup(obj, paths["specReplicasPath"]) or 0},
            "status": status,
        }

    def _scale_to_object_patch(self, request: kmock.Request) -> dict[str, Any]:
        """A Scale patch or replacement, as a merge patch of the scaled object."""
        assert request.resource is not None
        path = self._scale_paths(request.resource)["specReplicasPath"]
        replicas: Any = None
        if isinstance(request.data, dict):
            replicas = (request.data.get("spec") or {}).get("replicas")
        elif isinstance(request.data, list):  # a JSON patch
            for op in request.data:
                if op.get("path") == "/spec/replicas" and op.get("op") in {"add", "replace"}:
                    replicas = op["value"]
        if replicas is None:
            return {}
        patch: dict[str, Any] = {}
        *parents, leaf = path.strip(".").split(".")
        level = patch
        for key in parents:
            level = level.setdefault(key, {})
        level[leaf] = replicas
        return patch


def _grace_s(request: kmock.Request, pod: dict[str, Any]) -> int:
    """The grace a DELETE asks for (`?gracePeriodSeconds=`, or DeleteOptions in its
    body), else the pod's own `terminationGracePeriodSeconds` (30 by default)."""
    asked = request.params.get("gracePeriodSeconds")
    if asked is None and isinstance(request.data, dict):
        asked = request.data.get("gracePeriodSeconds")
    return _pod_grace_s(pod) if asked is None else int(asked)


def _pod_grace_s(pod: dict[str, Any]) -> int:
    return int(pod.get("spec", {}).get("terminationGracePeriodSeconds", 30))


def _mark_terminating(obj: Any, grace: int) -> None:
    """A graceful deletion's mark: the object stays until deleted with a grace of 0."""
    obj.patch({"metadata": {"deletionTimestamp": _now(), "deletionGracePeriodSeconds": grace}})


def _failure(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> aiohttp.web.Response:
    """An error as kube-apiserver answers it: a `Status` object."""
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        status["details"] = details
    return aiohttp.web.json_response(status, status=code)


def _amend(request: kmock.Request, **fields: Any) -> None:
    """Change a (frozen) request in place: kmock matches reactions to requests by identity."""
    for name, value in fields.items():
        object.__setattr__(request, name, value)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`."""
    out: dict[str, Any] = {key: None for key in old.keys() - new.keys()}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            inner = _merge_diff(old[key], value)
            if inner:
                out[key] = inner
        elif key not in old or old[key] != value:
            out[key] = copy.deepcopy(value)
    return out


def _desired(obj: dict[str, Any]) -> dict[str, Any]:
    """What bumps `generation` when it changes: all but metadata and status."""
    return {key: value for key, value in obj.items() if key not in {"metadata", "status"}}


def _wants_table(request: kmock.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


_FILTER = re.compile(r'^(\w+)\[\?\(@\.(\w+)=="([^"]*)"\)\]$')


def _lookup(obj: Any, json_path: str) -> Any:
    """Follow a dotted json path such as `.status.replicas`, or with a filter on a list
    such as `.status.conditions[?(@.type=="Ready")].status` (its first match), as
    kube-apiserver renders printer columns; None where it leads nowhere."""
    if not json_path:
        return None
    for key in re.split(r"\.(?![^\[]*\])", json_path.strip(".")):
        found = _FILTER.match(key)
        if found is None:
            obj = obj.get(key) if isinstance(obj, dict) else None
            continue
        name, field, value = found.groups()
        items = obj.get(name) if isinstance(obj, dict) else None
        obj = next((i for i in items or [] if isinstance(i, dict) and i.get(field) == value), None)
    return obj


def _cell(column: dict[str, Any], obj: dict[str, Any]) -> Any:
    value = _lookup(obj, column["jsonPath"])
    if value is None:
        return None
    if column["type"] == "date":
        return _age(value)
    if column["type"] == "string" and not isinstance(value, str):
        return json.dumps(value)
    return value


def _age(timestamp: str) -> str:
    """Like the API server's duration.HumanDuration, coarser."""
    then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    seconds = max(0, int((datetime.datetime.now(datetime.UTC) - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 3 * 3600:
        return f"{seconds // 60}m"
    if seconds < 48 * 3600:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


@contextlib.asynccontextmanager
async def served(emulator: KubernetesEmulator, port: int = 0) -> AsyncIterator[str]:
    """Serve the emulator on `port` (0: a free one) of 127.0.0.1 in the running event loop;
    yields the base URL (`http://127.0.0.1:PORT`). A test that runs its clients in the
    same loop can put that loop on fake time: every request is answered within it."""
    async with emulator:
        server = aiohttp.web.Server(emulator, handler_cancellation=True)
        runner = aiohttp.web.ServerRunner(server, shutdown_timeout=0.5)
        await runner.setup()
        try:
            site = aiohttp.web.TCPSite(runner, "127.0.0.1", port)
            await site.start()
            host, bound = runner.addresses[0][:2]
            yield f"http://{host}:{bound}"
        finally:
            await runner.cleanup()


@contextlib.contextmanager
def serve(emulator: KubernetesEmulator | None = None, port: int = 0) -> Iterator[str]:
    """Serve the emulator on `port` (0: a free one) of 127.0.0.1 from a thread with its own
    event loop.

    Yields the base URL (`http://127.0.0.1:PORT`). An emulator can be served only once.
    Change its state through the API; reading `emulator.objects` from the test's thread
    is fine for assertions.
    """
    handler = emulator if emulator is not None else KubernetesEmulator()
    loop = asyncio.new_event_loop()
    url: concurrent.futures.Future[str] = concurrent.futures.Future()
    stop = asyncio.Event()

    async def main() -> None:
        async with served(handler, port) as bound:
            url.set_result(bound)
            await stop.wait()

    def run() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:
            if not url.done():
                url.set_exception(exc)
            raise
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="k8s-emulator", daemon=True)
    thread.start()
    try:
        yield url.result(timeout=10)
    finally:
        with contextlib.suppress(RuntimeError):  # the loop is closed already
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)


def write_kubeconfig(path: Path, url: str, namespace: str = "default") -> Path:
    """Write a kubeconfig for `kubectl --kubeconfig PATH` to talk to the emulator at url."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "test"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "tester", "namespace": namespace},
            }
        ],
        "current-context": "emulator",
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML too
    return path


class ApiError(Exception):
    """An error status from the API: `code` is the HTTP status, `status` the Status body."""

    def __init__(self, code: int, status: Any) -> None:
        super().__init__(f"HTTP {code}: {status}")
        self.code = code
        self.status = status


def call(url: str, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
    """One JSON request to the API at url; PATCH bodies go as merge patches by default.

    Raises `ApiError` on an error status.
    """
    content_type = content_type or (
        "application/merge-patch+json" if method == "PATCH" else "application/json"
    )
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url + path, data=data, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            status = json.loads(text)
        except ValueError:
            status = text
        raise ApiError(exc.code, status) from None


__all__ = ["ApiError", "KubernetesEmulator", "call", "serve", "served", "write_kubeconfig"]
