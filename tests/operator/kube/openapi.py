"""Test support, not product code: what the API server does with a CRD's schema that the
tests need without one. `apply_defaults` fills in schema defaults as the API server does
before validation; `to_json_schema` turns a structural OpenAPI v3.0 schema into JSON
Schema so `jsonschema` can validate objects against it; `rules` lists every CEL rule
with the path of the object it applies to."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    obj = copy.deepcopy(obj)
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = apply_defaults(sub, obj[name])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        obj = [apply_defaults(schema["items"], item) for item in obj]
    return obj


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {k: to_json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = to_json_schema(value)
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            if value:
                out[key] = node["minimum" if key == "exclusiveMinimum" else "maximum"]
        else:
            out[key] = value
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if node.get(exclusive):
            out.pop(bound, None)
    if "properties" in out and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False  # what pruning would drop, refused here
    if node.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


def rules(
    node: dict[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], dict[str, str]]]:
    """(path, rule) for every x-kubernetes-validations entry; `[]` in a path is every
    item of a list."""
    for rule in node.get("x-kubernetes-validations", []):
        yield path, rule
    for name, sub in node.get("properties", {}).items():
        yield from rules(sub, (*path, name))
    if isinstance(node.get("items"), dict):
        yield from rules(node["items"], (*path, "[]"))


def at(obj: Any, path: tuple[str, ...]) -> list[Any]:
    """The objects a rule at `path` is evaluated on."""
    found = [obj]
    for part in path:
        if part == "[]":
            found = [item for o in found for item in o]
        else:
            found = [o[part] for o in found if isinstance(o, dict) and part in o]
    return found
