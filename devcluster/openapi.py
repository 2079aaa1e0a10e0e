"""Test support, not product code: what the API server does with a CRD's schema that the
tests need without one. `apply_defaults` fills in schema defaults as the API server does
before validation; `prune` drops fields the schema does not know (`unknown` names them,
for strict field validation); `to_json_schema` turns
a structural OpenAPI v3.0 schema into JSON Schema so `jsonschema` can validate objects
against it; `rules` lists every CEL rule with the path of the object it applies to, and
`cel_broken` runs them (cel-python) as the API server does on a create or an update;
`refusals` is all of it, what the emulator answers 422 with."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema
from celpy.adapter import json_to_cel


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
    item of a list, `{}` every value of a map."""
    for rule in node.get("x-kubernetes-validations", []):
        yield path, rule
    for name, sub in node.get("properties", {}).items():
        yield from rules(sub, (*path, name))
    if isinstance(node.get("items"), dict):
        yield from rules(node["items"], (*path, "[]"))
    if isinstance(node.get("additionalProperties"), dict):
        yield from rules(node["additionalProperties"], (*path, "{}"))


def at(obj: Any, path: tuple[str, ...]) -> list[Any]:
    """The objects a rule at `path` is evaluated on."""
    found = [obj]
    for part in path:
        if part == "[]":
            found = [item for o in found for item in o]
        elif part == "{}":
            found = [value for o in found if isinstance(o, dict) for value in o.values()]
        else:
            found = [o[part] for o in found if isinstance(o, dict) and part in o]
    return found


def prune(schema: dict[str, Any], obj: Any) -> Any:
    """`obj` without the fields `schema` does not declare (structural pruning), but where
    it preserves unknown fields."""
    if isinstance(obj, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return copy.deepcopy(obj)
        if "properties" in schema:
            props = schema["properties"]
            return {k: prune(props[k], v) for k, v in obj.items() if k in props}
        if isinstance(schema.get("additionalProperties"), dict):
            return {k: prune(schema["additionalProperties"], v) for k, v in obj.items()}
        return copy.deepcopy(obj)
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [prune(schema["items"], item) for item in obj]
    return copy.deepcopy(obj)


def unknown(schema: dict[str, Any], obj: Any, path: str = "") -> list[str]:
    """The dotted paths of the fields `prune` would drop: what `fieldValidation=Strict`
    refuses."""
    found: list[str] = []
    if isinstance(obj, dict) and not schema.get("x-kubernetes-preserve-unknown-fields"):
        if "properties" in schema:
            props = schema["properties"]
            for k, v in obj.items():
                where = f"{path}.{k}" if path else k
                found += unknown(props[k], v, where) if k in props else [where]
        elif isinstance(schema.get("additionalProperties"), dict):
            for k, v in obj.items():
                found += unknown(schema["additionalProperties"], v, f"{path}.{k}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            found += unknown(schema["items"], item, f"{path}[{i}]")
    return found


def transition(rule: dict[str, str]) -> bool:
    """A transition rule: it reads the stored object (`oldSelf`)."""
    return "oldSelf" in rule["rule"]


def cel_broken(
    schema: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None = None
) -> list[tuple[str, str]]:
    """(path, message) of each CEL rule `obj` (defaulted as the API server would) breaks:
    created, or with `old` as an update of that stored object. As the API server does,
    transition rules run on updates only, and only where the node they sit on is in both
    objects; the others run on the new object either way."""
    obj = apply_defaults(schema, obj)
    stored = None if old is None else apply_defaults(schema, old)
    broken = []
    for path, rule in rules(schema):
        program = _program(rule["rule"])
        if transition(rule):
            # An item of a list has no old item to compare it with unless the list is
            # x-kubernetes-list-type map (none with rules here): the API server refuses
            # a transition rule there.
            assert "[]" not in path, f"transition rule at {path} is inside a list"
            assert "{}" not in path, f"transition rule at {path} is inside a map"
            pairs = [] if stored is None else zip(at(obj, path), at(stored, path), strict=False)
            activations = [{"self": json_to_cel(n), "oldSelf": json_to_cel(o)} for n, o in pairs]
        else:
            activations = [{"self": json_to_cel(target)} for target in at(obj, path)]
        for activation in activations:
            verdict = program.evaluate(activation)
            assert isinstance(verdict, celpy.celtypes.BoolType), (rule, verdict)
            if not verdict:
                where = ".".join(path).replace(".[]", "[*]").replace(".{}", "[*]")
                broken.append((where, rule["message"]))
    return broken


@functools.cache
def _program(rule: str) -> celpy.Runner:
    """A rule compiled once: cel-python builds a parser (about 25 ms) per Environment and
    compiles on every call, which made each write to the emulator cost tens of ms."""
    env = celpy.Environment()
    return env.program(env.compile(rule))


def refusals(
    schema: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None = None
) -> list[tuple[str, str]]:
    """(field path, message) of everything the API server refuses `obj` for: its schema
    (types, required fields, enums, bounds, patterns) and its CEL rules."""
    found = []
    for error in jsonschema.Draft7Validator(to_json_schema(schema)).iter_errors(obj):
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        found.append((where.lstrip("."), error.message))
    if not found:
        found = cel_broken(schema, obj, old)
    return found
