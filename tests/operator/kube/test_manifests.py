"""Every manifest a user applies is valid: the kustomize base renders with the kubectl
these machines carry and each object passes `kubernetes-validate` for Kubernetes 1.30
(Cadence's own kinds pass their generated schemas and CEL rules instead, and the
Prometheus Operator's kinds, whose schemas kubernetes-validate lacks, are checked for
the fields they need); the RBAC grants nothing by wildcard; the HPA targets a
RolloutGroup the example pool creates."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from cadence.cli import build_parser
from cadence.devcluster.openapi import to_json_schema
from cadence.operator.api.resources import (
    IMAGE,
    RolloutPool,
    RolloutPoolSpec,
    TrainingRun,
    groups_of,
)
from cadence.operator.kube import crds
from tests.helpers import ROOT

MANIFESTS = ROOT / "manifests"
SCHEMAS = {
    k.name: crds.crd(k)["spec"]["versions"][0]["schema"]["openAPIV3Schema"] for k in crds.KINDS
}


def _kustomize(folder: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(folder)], capture_output=True, text=True, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _check(doc: dict[str, Any]) -> None:
    group = doc["apiVersion"].split("/")[0]
    if group == "cadence.dev":
        jsonschema.validate(doc, to_json_schema(SCHEMAS[doc["kind"]]))
        models: dict[str, type[BaseModel]] = {
            "RolloutPool": RolloutPool,
            "TrainingRun": TrainingRun,
        }
        models[doc["kind"]].model_validate(doc)
    elif group == "monitoring.coreos.com":
        assert doc["kind"] in ("ServiceMonitor", "PodMonitor")
        endpoints = doc["spec"].get("endpoints") or doc["spec"]["podMetricsEndpoints"]
        assert doc["spec"]["selector"]["matchLabels"] and all("port" in e for e in endpoints)
    else:
        assert kubernetes_validate.validate(doc, "1.30", strict=True) == "1.30"


@pytest.mark.kubectl  # kubectl kustomize
def test_the_top_level_kustomization_installs_the_base() -> None:
    assert _kustomize(MANIFESTS) == _kustomize(MANIFESTS / "base")


@pytest.mark.kubectl  # kubectl kustomize
def test_the_base_renders_and_every_object_is_valid() -> None:
    docs = _kustomize(MANIFESTS / "base")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRole",  # cadence-view, aggregated into view, edit and admin
            "ClusterRole",  # cadence-edit, aggregated into edit and admin
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "Deployment",
            "Namespace",
            "Role",  # the leader election's Lease, in its own namespace
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    )
    for doc in docs:
        _check(doc)
        cluster_wide = (
            "Namespace",
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleBinding",
        )
        if doc["kind"] not in cluster_wide:
            assert doc["metadata"]["namespace"] == "cadence-system", doc["kind"]
    # The operator is probed while it starts, and runs with the resources it asks for.
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (operator,) = deployment["spec"]["template"]["spec"]["containers"]
    assert operator["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert operator["resources"]["requests"]["memory"] == "256Mi"
    # Two replicas, one leader: the arguments are ones `cadence operator` takes.
    args = build_parser().parse_args(operator["args"])
    assert args.leader_elect and deployment["spec"]["replicas"] == 2


@pytest.mark.kubectl  # kubectl kustomize
def test_the_namespaced_install_stays_in_its_namespace() -> None:
    """manifests/namespaced: nothing cluster-wide, everything in one namespace, the
    operator watching the namespace it runs in, bound to its Roles there; its Role
    is the ClusterRole less the cluster-wide reads."""
    docs = _kustomize(MANIFESTS / "namespaced")
    assert sorted(d["kind"] for d in docs) == sorted(
        [
            "Deployment",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    )
    for doc in docs:
        _check(doc)
        assert doc["metadata"]["namespace"] == "rl-team", doc["kind"]
    for binding in (d for d in docs if d["kind"] == "RoleBinding"):
        assert binding["subjects"][0]["namespace"] == "rl-team"
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (operator,) = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(operator["args"])
    assert args.namespace == ["$(POD_NAMESPACE)"] and not args.all_namespaces
    (env,) = operator["env"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    role = next(
        d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "cadence-operator"
    )
    base = _kustomize(MANIFESTS / "base")
    cluster = next(
        d
        for d in base
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "cadence-operator"
    )
    cluster_wide = {"namespaces", "customresourcedefinitions"}
    assert role["rules"] == [r for r in cluster["rules"] if not cluster_wide & set(r["resources"])]


@pytest.mark.kubectl  # kubectl kustomize
def test_the_operator_is_granted_nothing_by_wildcard() -> None:
    docs = _kustomize(MANIFESTS / "base")
    (role,) = [d for d in docs if d["metadata"]["name"] == "cadence-operator" and "rules" in d]
    for rule in role["rules"]:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], rule
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert ("cadence.dev", "rolloutgroups/status", "patch") in granted
    # The token Secret is read or made, never listed cluster-wide or changed.
    assert {("", "secrets", v) for v in ("get", "create")} <= granted
    assert not {("", "secrets", v) for v in ("list", "watch", "patch", "delete")} & granted
    assert ("cadence.dev", "rolloutgroups/finalizers", "update") in granted


@pytest.mark.parametrize("name", ["trainingrun.yaml", "heterogeneous.yaml", "trl.yaml"])
def test_the_examples_are_valid_resources(name: str) -> None:
    docs = [d for d in yaml.safe_load_all((MANIFESTS / "examples" / name).read_text()) if d]
    assert sorted(d["kind"] for d in docs) == ["RolloutPool", "TrainingRun"]
    for doc in docs:
        _check(doc)


def test_the_heterogeneous_example_names_three_vendors_devices() -> None:
    doc = next(yaml.safe_load_all((MANIFESTS / "examples" / "heterogeneous.yaml").read_text()))
    pool = RolloutPool.model_validate(doc)
    assert [(g.accelerator, *g.resources) for g in pool.spec.groups] == [
        ("H800", "nvidia.com/gpu"),
        ("A910X", "huawei.com/Ascend910"),
        ("BI-V150", "iluvatar.ai/gpu"),
    ]


def test_the_hpa_scales_a_rollout_group_the_example_pool_creates() -> None:
    hpa = yaml.safe_load((MANIFESTS / "autoscaling" / "hpa.yaml").read_text())
    _check(hpa)
    doc = next(yaml.safe_load_all((MANIFESTS / "examples" / "heterogeneous.yaml").read_text()))
    names = {g.metadata.name for g in groups_of(RolloutPool.model_validate(doc))}
    target = hpa["spec"]["scaleTargetRef"]
    assert target["kind"] == "RolloutGroup" and target["name"] in names
    # The namespace the install guide applies the example to.
    assert hpa["metadata"]["namespace"] == "cadence-system"
    assert target["apiVersion"] == "cadence.dev/v1alpha1"


def test_keda_scales_a_rollout_group_to_the_operators_desired_replicas() -> None:
    scaled = yaml.safe_load((MANIFESTS / "autoscaling" / "keda.yaml").read_text())
    doc = next(yaml.safe_load_all((MANIFESTS / "examples" / "heterogeneous.yaml").read_text()))
    names = {g.metadata.name for g in groups_of(RolloutPool.model_validate(doc))}
    target = scaled["spec"]["scaleTargetRef"]
    assert target["kind"] == "RolloutGroup" and target["name"] in names
    (trigger,) = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert f'cadence_group_desired_replicas{{rolloutgroup="{target["name"]}"}}' in query
    assert scaled["metadata"]["namespace"] == "cadence-system"


@pytest.mark.kubectl  # kubectl kustomize
def test_the_monitoring_manifests_render_and_the_dashboard_parses() -> None:
    docs = _kustomize(MANIFESTS / "monitoring")
    for doc in docs:
        _check(doc)
    dashboard = next(d for d in docs if d["kind"] == "ConfigMap")
    panels = json.loads(dashboard["data"]["cadence.json"])["panels"]
    assert panels and all(p["targets"][0]["expr"].strip() for p in panels)


@pytest.mark.kubectl  # kubectl kustomize
def test_users_get_cadence_through_the_clusters_view_and_edit_roles() -> None:
    roles = {
        d["metadata"]["name"]: d
        for d in _kustomize(MANIFESTS / "base")
        if d["kind"] == "ClusterRole"
    }
    view, edit = roles["cadence-view"], roles["cadence-edit"]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in edit["metadata"]["labels"]
    viewing = {v for rule in view["rules"] for v in rule["verbs"]}
    assert viewing <= {"get", "list", "watch"}
    editing = {(r, v) for rule in edit["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert ("trainingruns", "create") in editing and ("rolloutgroups/scale", "patch") in editing


def test_every_place_names_the_image_of_this_version() -> None:
    """The Containerfile's image is `cadence:<package version>`: the Deployment, the
    examples, the CRD's default and the install guide name that one, never `latest`."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    image = f"cadence:{version}"
    assert image == IMAGE == RolloutPoolSpec.model_fields["image"].default
    (deployment,) = yaml.safe_load_all((MANIFESTS / "base" / "deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image
    pool, run = (
        d for d in yaml.safe_load_all((MANIFESTS / "examples" / "heterogeneous.yaml").read_text())
    )
    assert pool["spec"]["image"] == image and run["spec"]["trainer"]["image"] == image
    for text in (
        (ROOT / "docs" / "kubernetes.md").read_text(),
        (ROOT / "Containerfile").read_text(),
    ):
        assert f"-t {image} ." in text and ":latest" not in text


def test_the_tls_example_certifies_the_namespace_the_pool_example_is_applied_in() -> None:
    pool_doc = (MANIFESTS / "examples" / "heterogeneous.yaml").read_text()
    (namespace,) = set(re.findall(r"kubectl apply -n (\S+)", pool_doc))
    docs = [d for d in yaml.safe_load_all((MANIFESTS / "examples" / "tls.yaml").read_text())]
    assert {d["metadata"]["namespace"] for d in docs} == {namespace}
    (certificate,) = [d for d in docs if d["metadata"]["name"] == "fleet-tls"]
    assert f"*.fleet-workers.{namespace}.svc" in certificate["spec"]["dnsNames"]
