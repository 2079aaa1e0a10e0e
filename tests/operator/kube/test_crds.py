"""The CRDs in `crds/` are what the resource models generate; their schemas are
structural, pass `kubernetes-validate` for Kubernetes 1.30, describe every field, accept
the example resources and refuse what the models refuse, and every CEL rule compiles and
decides as the pydantic validator beside it does; the transition rules (`oldSelf`) refuse
changing what the operator cannot honour on a live object, and nothing else."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from cadence.cli import main
from cadence.devcluster.openapi import cel_broken, rules, to_json_schema, transition
from cadence.operator.api.files import load
from cadence.operator.api.resources import RolloutGroup, RolloutPool, TrainingRun, groups_of
from cadence.operator.kube import crds
from tests.helpers import ROOT

EXAMPLE = ROOT / "manifests" / "examples" / "trainingrun.yaml"
MODELS: dict[str, type[Any]] = {
    "RolloutPool": RolloutPool,
    "RolloutGroup": RolloutGroup,
    "TrainingRun": TrainingRun,
}


def _schemas() -> dict[str, dict[str, Any]]:
    return {
        k.name: crds.crd(k)["spec"]["versions"][0]["schema"]["openAPIV3Schema"] for k in crds.KINDS
    }


def _examples() -> dict[str, dict[str, Any]]:
    pool, _ = load(EXAMPLE)
    docs = {d["kind"]: d for d in yaml.safe_load_all(EXAMPLE.read_text())}
    docs["RolloutGroup"] = groups_of(pool)[0].model_dump(by_alias=True, exclude_none=True)
    return docs


def _transition(rule: dict[str, str]) -> bool:
    return transition(rule)


def _cel_decides(kind: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """The messages of the CEL rules `obj` breaks (`openapi.cel_broken`)."""
    return [message for _, message in cel_broken(_schemas()[kind], obj, old)]


DROP = object()  # a change that removes the field


def _edited(obj: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """A copy of `obj` with each dotted path under `spec` set to its value (or removed)."""
    obj = copy.deepcopy(obj)
    for dotted, value in change.items():
        node = obj["spec"]
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        if value is DROP:
            del node[leaf]
        else:
            node[leaf] = value
    return obj


def test_the_files_in_crds_are_what_the_models_generate(tmp_path: Path) -> None:
    for name, text in crds.rendered().items():
        assert (ROOT / "crds" / name).read_text() == text, f"crds/{name} is stale: cadence crds"
    assert main(["crds", "--check", "--out", str(ROOT / "crds")]) == 0
    crds.write(tmp_path)
    (tmp_path / "trainingruns.cadence.dev.yaml").write_text("# edited\n")
    assert main(["crds", "--check", "--out", str(tmp_path)]) == 1


def test_every_schema_is_structural_and_the_check_finds_what_is_not() -> None:
    for kind, schema in _schemas().items():
        assert crds.structural_errors(schema) == [], kind
    bad = {
        "type": "object",
        "properties": {
            "a": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "b": {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}},
            "c": {"type": "number", "exclusiveMinimum": 0},
        },
    }
    assert crds.structural_errors(bad) == [
        ".a: no type",
        ".a: anyOf is not allowed",
        ".b: properties and additionalProperties together",
        ".c: exclusiveMinimum must be a boolean in OpenAPI v3.0",
    ]


def _undescribed(node: dict[str, Any], path: str) -> list[str]:
    """Every property under `node` (in objects, list items and map values) that has no
    description; a free-form object (x-kubernetes-preserve-unknown-fields) has no
    properties of its own, so its description is the property's."""
    missing = []
    for name, sub in node.get("properties", {}).items():
        where = f"{path}.{name}"
        if not sub.get("description"):
            missing.append(where)
        missing += _undescribed(sub, where)
    if isinstance(node.get("items"), dict):
        missing += _undescribed(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        missing += _undescribed(node["additionalProperties"], f"{path}{{}}")
    return missing


def test_every_field_of_every_crd_has_a_description() -> None:
    """What `kubectl explain` shows: each field's docstring in `resources.py`."""
    missing = []
    for kind, schema in _schemas().items():
        for part in ("spec", "status"):
            node = schema["properties"][part]
            if not node.get("description"):
                missing.append(f"{kind} .{part}")
            missing += [f"{kind} {p}" for p in _undescribed(node, f".{part}")]
    assert missing == [], "no description (a docstring under the field): " + ", ".join(missing)
    free_form = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    bad = {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "b": {"type": "array", "items": {"type": "object", "properties": {"c": {}}}},
            "d": {**free_form, "description": "described"},
            "e": {"type": "object", "additionalProperties": {"properties": {"f": {}}}},
        },
    }
    assert _undescribed(bad, "") == [".a", ".b", ".b[].c", ".e", ".e{}.f"]


def test_every_crd_passes_kubernetes_validate_for_1_30() -> None:
    for path in sorted((ROOT / "crds").glob("*.cadence.dev.yaml")):
        document = yaml.safe_load(path.read_text())
        assert kubernetes_validate.validate(document, "1.30", strict=True) == "1.30"


def test_the_crds_carry_status_scale_columns_short_names_and_the_category() -> None:
    by_kind = {k.name: crds.crd(k)["spec"] for k in crds.KINDS}
    for spec in by_kind.values():
        version = spec["versions"][0]
        assert version["subresources"]["status"] == {}
        assert spec["names"]["categories"] == ["cadence"] and spec["names"]["shortNames"]
        schema = version["schema"]["openAPIV3Schema"]
        for column in version["additionalPrinterColumns"]:
            node = schema
            # A filter (`conditions[?(@.type=="Ready")]`) reads the list's items.
            json_path = re.sub(r"\[\?\(.*?\)\]", "[]", column["jsonPath"])
            for part in json_path.lstrip(".").split(".")[:-1]:
                node = node["properties"][part.removesuffix("[]")]
                if part.endswith("[]"):
                    node = node["items"]
            if not column["jsonPath"].startswith(".metadata"):
                assert json_path.split(".")[-1] in node["properties"], column
        # Conditions are a map by type (merged by type, as Kubernetes lists them), and
        # every kind shows whether it is Degraded in `kubectl get`.
        conditions = schema["properties"]["status"]["properties"]["conditions"]
        assert conditions["x-kubernetes-list-type"] == "map"
        assert conditions["x-kubernetes-list-map-keys"] == ["type"]
        assert "Degraded" in [c["name"] for c in version["additionalPrinterColumns"]]
    scale = by_kind["RolloutGroup"]["versions"][0]["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    group_spec = by_kind["RolloutGroup"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert "replicas" in group_spec["properties"]["spec"]["required"]


def test_the_examples_validate_against_the_generated_schemas() -> None:
    schemas = _schemas()
    for kind, obj in _examples().items():
        jsonschema.validate(obj, to_json_schema(schemas[kind]))
        assert _cel_decides(kind, obj) == [], kind


BAD = [
    ("RolloutPool", ("spec", "groups", 0, "affinity"), -1, None),
    ("TrainingRun", ("spec", "scheduler", "policy"), "round-robin", None),
    ("TrainingRun", ("spec", "model", "catalog"), "GPT-9", None),
    ("RolloutGroup", ("spec", "replicas"), "two", None),
    # A device count as Kubernetes reads quantities: "one" is not one.
    ("RolloutPool", ("spec", "groups", 0, "resources", "nvidia.com/gpu"), "one", None),
    # Nor may a request be negative. (An integer -1 the schema cannot refuse: an
    # int-or-string carries no minimum. A CEL rule does: RULE_CASES.)
    ("RolloutPool", ("spec", "groups", 0, "resources", "nvidia.com/gpu"), "-1", None),
    ("TrainingRun", ("spec", "trainer", "resources", "memory"), "16 GB", None),
    ("RolloutPool", ("spec", "groups", 0, "nodeSelector", "zone"), "bad value!", None),
]


@pytest.mark.parametrize("count", [1, "1", "500m", "16Gi", 0])
def test_a_quantity_is_taken_as_kubernetes_writes_it(count: int | str) -> None:
    """`nvidia.com/gpu: 1` (an integer, as everyone writes it) is a quantity too."""
    obj = copy.deepcopy(_examples()["RolloutPool"])
    obj["spec"]["groups"][0]["resources"] = {"nvidia.com/gpu": count}
    pool = MODELS["RolloutPool"].model_validate(obj)
    assert pool.spec.groups[0].resources == {"nvidia.com/gpu": count}
    jsonschema.validate(obj, to_json_schema(_schemas()["RolloutPool"]))


@pytest.mark.parametrize("key", ["bad key!", "-zone", "a/b/c", "x" * 64])
def test_a_node_selector_key_that_is_not_a_label_key_is_refused(key: str) -> None:
    obj = copy.deepcopy(_examples()["RolloutPool"])
    obj["spec"]["groups"][0]["nodeSelector"] = {key: "a"}
    with pytest.raises(ValidationError, match="is not a label key"):
        MODELS["RolloutPool"].model_validate(obj)


@pytest.mark.parametrize(("kind", "path", "value", "_"), BAD)
def test_the_schemas_refuse_what_the_models_refuse(
    kind: str, path: tuple[Any, ...], value: Any, _: None
) -> None:
    obj = copy.deepcopy(_examples()[kind])
    node = obj
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    node[path[-1]] = value
    with pytest.raises(ValidationError):
        MODELS[kind].model_validate(obj)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, to_json_schema(_schemas()[kind]))


RULE_CASES = [
    # (kind, change to the example, what the CEL rules say: broken messages)
    ("RolloutPool", {"groups.1.name": "h800"}, ["group names must be unique"]),
    (
        "RolloutPool",
        {"groups.0.replicas": 70},
        ["minReplicas <= replicas <= maxReplicas must hold"],
    ),
    (
        "RolloutGroup",
        {"minReplicas": 3},
        ["minReplicas <= replicas <= maxReplicas must hold"],
    ),
    (
        "RolloutPool",
        {"groups.0.accelerator": "TPU-v9"},
        ["accelerator must be a catalog type, or give its figures under custom"],
    ),
    (
        "RolloutPool",
        {
            "groups.0.accelerator": "TPU-v9",
            "groups.0.custom": {"memoryGb": 96, "bandwidthTbS": 1.6, "bf16Tflops": 459},
        },
        [],
    ),
    (
        "TrainingRun",
        {"model.uri": "pvc://weights/q", "model.path": "/models/q"},
        ["give model.uri (a claim to mount) or model.path, not both"],
    ),
    ("TrainingRun", {"model.uri": "pvc://weights/q"}, []),
    ("RolloutPool", {"groups.0.resources": {"nvidia.com/gpu": -1}}, ["a quantity is at least 0"]),
    ("RolloutPool", {"groups.0.resources": {"nvidia.com/gpu": 2, "memory": "8Gi"}}, []),
    ("TrainingRun", {"trainer.resources": {"nvidia.com/gpu": -2}}, ["a quantity is at least 0"]),
    (
        "RolloutPool",
        {"autoscaling": {"enabled": True}},
        ["autoscaling needs budgetPerHour when enabled"],
    ),
    ("RolloutPool", {"autoscaling": {"enabled": True, "budgetPerHour": 30}}, []),
    ("RolloutPool", {"autoscaling": {"enabled": False}}, []),
]


@pytest.mark.parametrize(("kind", "change", "broken"), RULE_CASES)
def test_each_cel_rule_decides_as_the_model_does(
    kind: str, change: dict[str, Any], broken: list[str]
) -> None:
    obj = _edited(_examples()[kind], change)
    assert _cel_decides(kind, obj) == broken
    if broken:
        with pytest.raises(ValidationError):
            MODELS[kind].model_validate(obj)
    else:
        MODELS[kind].model_validate(obj)


NAME_CASES = [
    # (kind, metadata.name, the first group's name or None, broken messages' start)
    ("RolloutPool", "8xh800", None, ["a pool's name starts with a letter"]),
    (
        "RolloutPool",
        "p" * 56,
        None,
        ["a pool's name starts with a letter", "a pool's name and each group's name"],
    ),
    ("RolloutPool", "p" * 50, "g" * 7, ["a pool's name and each group's name"]),
    ("RolloutPool", "p" * 50, "g" * 6, []),
    ("TrainingRun", "7b-grpo", None, ["a run's name starts with a letter"]),
    ("TrainingRun", "r" * 45, None, ["a run's name starts with a letter"]),
    ("TrainingRun", "r" * 44, None, []),
]


@pytest.mark.parametrize(("kind", "name", "group", "broken"), NAME_CASES)
def test_names_every_derived_name_is_built_from_are_checked_by_both(
    kind: str, name: str, group: str | None, broken: list[str]
) -> None:
    """A name a Service, pod or StatefulSet is derived from: refused where the user
    writes it (CEL) and where the operator reads it (the model), with the same verdict."""
    obj = copy.deepcopy(_examples()[kind])
    obj["metadata"]["name"] = name
    if group is not None:
        obj["spec"]["groups"][0]["name"] = group
    said = _cel_decides(kind, obj)
    assert [s for s in said if not any(s.startswith(b) for b in broken)] == []
    assert len(said) == len(broken)
    if broken:
        with pytest.raises(ValidationError, match=r"metadata\.name|characters together"):
            MODELS[kind].model_validate(obj)
    else:
        MODELS[kind].model_validate(obj)


def _fixed_run(field: str) -> str:
    return f"spec.{field} cannot change once the run exists; make a new TrainingRun"


def _fixed_group(field: str) -> str:
    return f"spec.{field} cannot change: the group's pods are named after it, and would be orphaned"


def test_the_transition_rules_are_where_a_change_cannot_be_honoured() -> None:
    """A RolloutGroup's pool and group name its pods; a run's pool is bound, and its
    trainer reads model, dataset, batch and trainer once (a ConfigMap made at binding,
    never updated), as its ledger records the model and the dataset's cursor. A required
    field carries its own rule; an optional one, which the API server does not default,
    is checked from its parent, so adding or removing it is refused too."""
    found = {
        kind: sorted(
            (".".join(path), rule["message"]) for path, rule in rules(schema) if _transition(rule)
        )
        for kind, schema in _schemas().items()
    }
    assert found == {
        "RolloutPool": [],
        "RolloutGroup": [
            ("spec.group", _fixed_group("group")),
            ("spec.pool", _fixed_group("pool")),
        ],
        "TrainingRun": sorted(
            [
                *[("spec", _fixed_run(f)) for f in ("model", "dataset", "trainer", "batch")],
                ("spec", _fixed_run("scheduler.eta")),
                ("spec.pool", _fixed_run("pool")),
            ]
        ),
    }


FIXED_CASES = [
    # (kind, change to the stored example, change to the new object, broken messages)
    ("TrainingRun", {}, {"pool": "other"}, [_fixed_run("pool")]),
    ("TrainingRun", {}, {"model.catalog": "Qwen3-14B"}, [_fixed_run("model")]),
    ("TrainingRun", {}, {"model.uri": "pvc://weights/q"}, [_fixed_run("model")]),
    ("TrainingRun", {}, {"model": DROP}, [_fixed_run("model")]),
    ("TrainingRun", {}, {"dataset.task": "arithmetic"}, [_fixed_run("dataset")]),
    ("TrainingRun", {"dataset": DROP}, {}, [_fixed_run("dataset")]),
    # Absent and spelled out at its defaults differ: the rule sees only what is stored.
    ("TrainingRun", {"dataset": DROP}, {"dataset": {"task": "digits"}}, [_fixed_run("dataset")]),
    ("TrainingRun", {}, {"trainer.learningRate": 0.02}, [_fixed_run("trainer")]),
    ("TrainingRun", {}, {"trainer.storage": "40Gi"}, [_fixed_run("trainer")]),
    ("TrainingRun", {}, {"trainer": DROP}, [_fixed_run("trainer")]),
    ("TrainingRun", {}, {"batch.iterations": 31}, [_fixed_run("batch")]),
    (
        "TrainingRun",
        {},
        {"pool": "other", "batch.maxTokens": 64},
        [_fixed_run("batch"), _fixed_run("pool")],
    ),
    ("RolloutGroup", {}, {"pool": "other"}, [_fixed_group("pool")]),
    ("RolloutGroup", {}, {"group": "h900"}, [_fixed_group("group")]),
    # What the operator follows on a live object: the loop's knobs, the worker pods.
    ("TrainingRun", {}, {"scheduler.eta": 2}, [_fixed_run("scheduler.eta")]),
    ("TrainingRun", {}, {"scheduler.policy": "sync", "scheduler.hMin": 512}, []),
    ("TrainingRun", {}, {"scheduler": DROP}, []),  # eta 1, as the example's
    ("TrainingRun", {"scheduler.eta": 2}, {"scheduler": DROP}, [_fixed_run("scheduler.eta")]),
    ("TrainingRun", {}, {"multiTurn": {"environment": "calculator", "maxToolCalls": 2}}, []),
    ("TrainingRun", {}, {}, []),
    ("RolloutGroup", {}, {"replicas": 3, "accelerator": "H100"}, []),
    ("RolloutPool", {}, {"groups.0.name": "h100", "image": "cadence:v2"}, []),
]


@pytest.mark.parametrize(("kind", "before", "after", "broken"), FIXED_CASES)
def test_an_update_is_refused_only_where_it_cannot_be_honoured(
    kind: str, before: dict[str, Any], after: dict[str, Any], broken: list[str]
) -> None:
    old = _edited(_examples()[kind], before)
    new = _edited(_examples()[kind], after)
    assert sorted(_cel_decides(kind, new, old)) == sorted(broken)
    # Created as it is (no stored object), each is a valid object: the API server runs
    # no transition rule on create, and the model, which never sees an old object, agrees.
    assert _cel_decides(kind, new) == []
    MODELS[kind].model_validate(new)


@pytest.mark.parametrize("kind", ["TrainingRun", "RolloutGroup"])
def test_a_create_runs_no_transition_rule(kind: str) -> None:
    """The API server skips transition rules when an object is made (there is no
    `oldSelf`): any pool, model or group name is taken then, and fixed after."""
    new = _edited(_examples()[kind], {"pool": "elsewhere"})
    assert any(_transition(rule) for _, rule in rules(_schemas()[kind]))
    assert _cel_decides(kind, new) == []
    assert _cel_decides(kind, new, old=_examples()[kind]) != []
