"""What the three custom resources share: the API group and version, the image they
name, the base model (camelCase in YAML, snake_case in Python, each field's docstring its
description in the CRD), names and their limits, Kubernetes quantities and labels, the
helpers that write CEL rules, and `ResourceError`, the one-sentence refusal."""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from cadence.common.catalog import ACCELERATORS


def _version() -> str:
    try:
        return importlib.metadata.version("cadence")
    except importlib.metadata.PackageNotFoundError:  # a source tree never installed
        return "0.0.0"


# The image built from this version (Containerfile); its tag follows the package's.
IMAGE = f"cadence:{_version()}"
GROUP = "cadence.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Pools and runs name what the operator makes for them, so their names must leave every
# derived name valid: a DNS-1035 label (a Service's name starts with a letter), and short
# enough for "{pool}-workers" (a Service), "{pool}-{group}-{index}" (a pod's hostname,
# index up to 5 digits) and "{run}-trainer" (a StatefulSet, whose revision-hash label
# caps its name at 52).
DNS_1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
POOL_NAME_MAX = 63 - len("-workers")
POOL_AND_GROUP_MAX = 63 - len("--99999")
RUN_NAME_MAX = 52 - len("-trainer")
MAX_REPLICAS = 99_999
MAX_LENGTH = 1_048_576  # tokens: no response is longer


class ResourceError(ValueError):
    """A resource that does not validate; the message is one sentence."""


class Spec(BaseModel):
    # A field's docstring (the string under it) is its description in the JSON schema,
    # so in the CRDs and in `kubectl explain`.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )


QUANTITY = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"


def _quantity(value: object) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r} is not a quantity (a number, or a string like 500m or 16Gi)")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative; a quantity is at least 0")
        return value
    if value.startswith("-"):
        raise ValueError(f"{value} is negative; a quantity is at least 0")
    if not re.fullmatch(QUANTITY, value):
        raise ValueError(f"{value!r} is not a quantity (a number, or a string like 500m or 16Gi)")
    return value


# A device or memory request as Kubernetes writes it: `nvidia.com/gpu: 1` or `"16Gi"`.
Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}],
            "pattern": QUANTITY,
            # An int-or-string carries no minimum in a CRD (the anyOf collapses): an
            # integer -1 passed. A rule of constant cost per value, unlike a regex rule.
            "x-kubernetes-validations": [
                {"rule": "type(self) != int || self >= 0", "message": "a quantity is at least 0"}
            ],
        }
    ),
]
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE, max_length=63)]


def label_keys(selector: dict[str, str]) -> dict[str, str]:
    for key in selector:
        if not re.fullmatch(LABEL_KEY, key) or len(key.rpartition("/")[2]) > 63:
            raise ValueError(f"node selector key {key!r} is not a label key")
    return selector


def cel_rule(rule: str, message: str) -> JsonDict:
    """A CEL rule the generated CRD carries (x-kubernetes-validations); the pydantic
    validator next to it checks the same, so both paths refuse the same objects (but for
    the transition rules below, which only the API server can check)."""
    return {"rule": rule, "message": message}


# Immutability, as CEL transition rules: what the operator cannot honour once an object
# exists. The API server checks them on updates only, with the stored object as
# `oldSelf` (never on create), so no model can check them: a file has no old object.
def cel_same(message: str) -> JsonDict:
    """On a field that is always present (required): it keeps its first value."""
    return cel_rule("self == oldSelf", message)


def cel_kept(field: str, message: str) -> JsonDict:
    """On the object holding `field` (its camelCase name): the field is never added,
    removed or changed. On the parent, not the field, because a field's own rule runs
    only when the field is in both objects, and one whose default is an object has no
    default in the CRD (the API server would not fill it in)."""
    return cel_rule(
        f"has(self.{field}) == has(oldSelf.{field})"
        f" && (!has(self.{field}) || self.{field} == oldSelf.{field})",
        message,
    )


KNOWN_ACCELERATOR = cel_rule(
    "has(self.custom) || self.accelerator in ["
    + ", ".join(f"'{a}'" for a in sorted(ACCELERATORS))
    + "]",
    "accelerator must be a catalog type, or give its figures under custom",
)
REPLICA_BOUNDS = cel_rule(
    "self.minReplicas <= self.replicas && self.replicas <= self.maxReplicas",
    "minReplicas <= replicas <= maxReplicas must hold",
)


# What the operator's own pods use; an overlay may not take these names.
RESERVED_VOLUMES = frozenset({"shm", "weights", "models", "state", "config"})
# UCX_TCP_PORT_RANGE keeps the KV data plane within the ports its NetworkPolicy opens.
RESERVED_ENV = frozenset({"CADENCE_TOKEN", "UCX_TCP_PORT_RANGE"})


class Metadata(Spec):
    model_config = ConfigDict(extra="allow", frozen=True)  # labels, annotations, uid, ...

    name: str = Field(pattern=DNS_LABEL)
    """The object's name, which the names of what the operator makes for it start with."""
    namespace: str = "default"
    """The object's namespace, where everything made for it lives too."""


POOL_NAME_RULES = (
    cel_rule(
        f"self.metadata.name.matches('{DNS_1035}') && size(self.metadata.name) <= {POOL_NAME_MAX}",
        f"a pool's name starts with a letter and has at most {POOL_NAME_MAX} characters "
        "(its workers' Service is named after it)",
    ),
    cel_rule(
        f"self.spec.groups.all(g, size(self.metadata.name) + size(g.name) <= {POOL_AND_GROUP_MAX})",
        f"a pool's name and each group's name have at most {POOL_AND_GROUP_MAX} characters "
        "together (its worker pods are named pool-group-index)",
    ),
)
RUN_NAME_RULES = (
    cel_rule(
        f"self.metadata.name.matches('{DNS_1035}') && size(self.metadata.name) <= {RUN_NAME_MAX}",
        f"a run's name starts with a letter and has at most {RUN_NAME_MAX} characters "
        "(its trainer's StatefulSet and Service are named after it)",
    ),
)


def check_name(name: str, longest: int, what: str) -> None:
    if not re.fullmatch(DNS_1035, name) or len(name) > longest:
        raise ValueError(
            f"metadata.name {name!r}: a {what}'s name starts with a letter, holds only a-z, "
            f"0-9 and '-', and has at most {longest} characters"
        )


def as_written(body: Mapping[str, Any]) -> dict[str, Any]:
    """A resource as its author wrote it, from the API server's object: kind, name,
    namespace, labels and spec (no status, no server-set metadata), for the models."""
    obj = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    obj["metadata"] = {
        k: v for k, v in body["metadata"].items() if k in ("name", "namespace", "labels")
    }
    return obj
