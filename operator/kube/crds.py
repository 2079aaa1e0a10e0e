"""The CustomResourceDefinitions, generated from the pydantic models in `resources.py`:
the same models validate a file for `cadence run` and describe the API server's schema,
so the two cannot drift (`cadence crds` writes `crds/`; a test fails when it is stale).

Pydantic's JSON schema becomes a structural OpenAPI v3 schema as Kubernetes wants it:
references inlined, `anyOf [X, null]` as `X` with `nullable`, numeric `exclusiveMinimum`
as OpenAPI 3.0's boolean form, `additionalProperties: false` dropped (the API server
prunes unknown fields instead), titles dropped, only scalar defaults kept (the API
server applies them before the CEL rules run). The CEL rules are the models' own
(`x-kubernetes-validations` in their `json_schema_extra`). `structural_errors` checks
the result the way the API server would refuse it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.config import JsonDict

from cadence.operator.api.resources import (
    GROUP,
    POOL_NAME_RULES,
    RUN_NAME_RULES,
    VERSION,
    RolloutGroup,
    RolloutGroupSpec,
    RolloutGroupStatus,
    RolloutPool,
    RolloutPoolSpec,
    RolloutPoolStatus,
    TrainingRun,
    TrainingRunSpec,
    TrainingRunStatus,
)

_DROPPED = {"title", "$defs"}


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    path: str
    description: str = ""
    priority: int = 0

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.path}
        if self.description:
            out["description"] = self.description
        if self.priority:
            out["priority"] = self.priority
        return out


@dataclass(frozen=True)
class Kind:
    model: type[BaseModel]
    spec: type[BaseModel]
    status: type[BaseModel]
    plural: str
    short_names: tuple[str, ...]
    description: str
    columns: tuple[Column, ...]
    scale: dict[str, str] = field(default_factory=dict)
    rules: tuple[JsonDict, ...] = ()  # CEL on the whole object (its name)

    @property
    def name(self) -> str:
        return self.model.__name__


AGE = Column("Age", "date", ".metadata.creationTimestamp")
# An invalid or failing object shows it in `kubectl get`, not as an empty row.
DEGRADED = Column(
    "Degraded",
    "string",
    '.status.conditions[?(@.type=="Degraded")].status',
    "spec invalid or failing",
)
READY = Column("Ready", "string", '.status.conditions[?(@.type=="Ready")].status')

KINDS = (
    Kind(
        RolloutPool,
        RolloutPoolSpec,
        RolloutPoolStatus,
        "rolloutpools",
        ("rpool",),
        "Groups of rollout workers, each of one accelerator type, that serve a TrainingRun.",
        (
            Column("Ready", "string", ".status.ready", "ready workers / desired"),
            Column("Workers", "integer", ".status.workers"),
            Column("Run", "string", ".status.run", "the TrainingRun it serves"),
            Column("Versions", "string", ".status.versions", "policy versions served"),
            Column("Tok/s", "number", ".status.tokensPerSecond"),
            DEGRADED,
            AGE,
        ),
        rules=POOL_NAME_RULES,
    ),
    Kind(
        RolloutGroup,
        RolloutGroupSpec,
        RolloutGroupStatus,
        "rolloutgroups",
        ("rgroup",),
        "One group of a RolloutPool, owned by it; its /scale subresource lets HPA or KEDA "
        "drive the group's size.",
        (
            Column("Pool", "string", ".spec.pool"),
            Column("Accelerator", "string", ".spec.accelerator"),
            Column("Desired", "integer", ".spec.replicas"),
            Column("Ready", "integer", ".status.readyReplicas"),
            Column("Pending", "integer", ".status.pendingTrajectories", "work waiting for it"),
            DEGRADED,
            AGE,
        ),
        scale={
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    ),
    Kind(
        TrainingRun,
        TrainingRunSpec,
        TrainingRunStatus,
        "trainingruns",
        ("trun",),
        "A model, a dataset, a trainer and the scheduler's knobs, bound to a RolloutPool.",
        (
            Column("Pool", "string", ".spec.pool"),
            Column("Phase", "string", ".status.phase"),
            Column("Version", "integer", ".status.policyVersion"),
            Column("Tok/s", "number", ".status.tokensPerSecond"),
            Column("P95", "number", ".status.latencyP95S", "trajectory latency P95, seconds"),
            READY,
            DEGRADED,
            AGE,
        ),
        rules=RUN_NAME_RULES,
    ),
)


def openapi(model: type[BaseModel]) -> dict[str, Any]:
    """A model's schema as a structural OpenAPI v3 schema (camelCase field names)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}))


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].removeprefix("#/$defs/")]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if sorted(o.get("type", "") for o in options) == ["integer", "string"]:
            # A number or a keyword (`auto`): int-or-string, its values checked by the
            # field's own CEL rule, as structural schemas allow no typed union.
            either = _convert({k: v for k, v in node.items() if k != "anyOf"}, defs)
            either["x-kubernetes-int-or-string"] = True
            return either
        if len(options) != 1:
            raise ValueError(f"a union of {len(options)} types has no structural schema")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        single = _convert({**options[0], **rest}, defs)
        if len(options) < len(node["anyOf"]):
            single["nullable"] = True
        return single
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out[key] = _convert(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "const":
            out["enum"] = [value]
        elif key == "description":
            out[key] = " ".join(str(value).split())
        elif key == "default":
            if value is not None and not isinstance(value, dict | list):
                out[key] = value
        else:
            out[key] = value
    return out


def schema(kind: Kind) -> dict[str, Any]:
    """The whole resource's schema: apiVersion, kind, metadata (the API server's own),
    spec and status."""
    out: dict[str, Any] = {
        "type": "object",
        "description": kind.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "The versioned schema of this representation of an object.",
            },
            "kind": {"type": "string", "description": "The REST resource this object is."},
            "metadata": {
                "type": "object",
                "description": "Standard object metadata: name, namespace, labels.",
            },
            "spec": openapi(kind.spec),
            "status": openapi(kind.status),
        },
    }
    if kind.rules:
        out["x-kubernetes-validations"] = list(kind.rules)
    return out


def crd(kind: Kind) -> dict[str, Any]:
    subresources: dict[str, Any] = {"status": {}}
    if kind.scale:
        subresources["scale"] = dict(kind.scale)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{kind.plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "cadence"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind.name,
                "listKind": f"{kind.name}List",
                "plural": kind.plural,
                "singular": kind.name.lower(),
                "shortNames": list(kind.short_names),
                "categories": ["cadence"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema(kind)},
                    "subresources": subresources,
                    "additionalPrinterColumns": [c.render() for c in kind.columns],
                }
            ],
        },
    }


def structural_errors(node: dict[str, Any], path: str = "") -> list[str]:
    """Where a schema is not structural (Kubernetes' rules, the parts a generated schema
    could break): every node has a type unless it preserves unknown fields or is
    int-or-string; no references or unions; properties and additionalProperties never
    together; metadata below the root says nothing but name and generateName."""
    errors = []
    here = path or "<root>"
    if "type" not in node and not (
        node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
    ):
        errors.append(f"{here}: no type")
    for key in ("$ref", "anyOf", "oneOf", "allOf", "not", "definitions", "$defs"):
        if key in node:
            errors.append(f"{here}: {key} is not allowed")
    if "properties" in node and "additionalProperties" in node:
        errors.append(f"{here}: properties and additionalProperties together")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in node and not isinstance(node[key], bool):
            errors.append(f"{here}: {key} must be a boolean in OpenAPI v3.0")
    for name, sub in node.get("properties", {}).items():
        errors += structural_errors(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        errors += structural_errors(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        errors += structural_errors(node["additionalProperties"], f"{path}{{}}")
    return errors


def rendered() -> dict[str, str]:
    """File name -> YAML text of every CRD."""
    files = {}
    for kind in KINDS:
        document = crd(kind)
        errors = structural_errors(document["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        if errors:
            raise ValueError(f"{kind.name}'s schema is not structural: {'; '.join(errors)}")
        header = "# Generated by `cadence crds` from operator/api/resources.py; do not edit.\n"
        files[f"{kind.plural}.{GROUP}.yaml"] = header + yaml.safe_dump(
            document, sort_keys=False, width=100
        )
    return files


def write(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in rendered().items():
        path = folder / name
        path.write_text(text)
        paths.append(path)
    return paths
