"""The Kubernetes emulator (cadence.devcluster.emulator) serves what the operator's tests
rely on: CRDs that register their kinds, objects with server-set metadata, `kubectl` with the
CRDs' printer columns, /scale through the CRD's scale paths, and a kopf operator."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from cadence.devcluster.emulator import (
    HISTORY,
    ApiError,
    KubernetesEmulator,
    call,
    serve,
    write_kubeconfig,
)
from cadence.operator.api.resources import IMAGE
from tests.helpers import ROOT, TRAINING_RUN, eventually, example

CRD_FILES = sorted((ROOT / "crds").glob("*.cadence.dev.yaml"))
EXAMPLE = TRAINING_RUN
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CADENCE = "/apis/cadence.dev/v1alpha1"
DEFAULT = f"{CADENCE}/namespaces/default"
pytestmark = pytest.mark.timeout(60)  # each takes a second or two


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _apply_crds(url: str) -> None:
    for path in CRD_FILES:
        for crd in _load(path):
            call(url, "POST", CRDS, crd)


@pytest.fixture
def url() -> Iterator[str]:
    with serve(KubernetesEmulator()) as base_url:
        yield base_url


@pytest.fixture
def cluster(url: str) -> str:
    """The emulator's URL, with the cadence.dev CRDs applied."""
    _apply_crds(url)
    return url


@pytest.fixture
def kubectl_result(cluster: str, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    config = write_kubeconfig(tmp_path / "kubeconfig", cluster)
    base = ["kubectl", "--kubeconfig", str(config), "--cache-dir", str(tmp_path / "cache")]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *args], capture_output=True, text=True, timeout=20, cwd=ROOT, check=False
        )

    return run


@pytest.fixture
def kubectl(kubectl_result: Callable[..., subprocess.CompletedProcess[str]]) -> Callable[..., str]:
    def run(*args: str) -> str:
        done = kubectl_result(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    return run


def test_crds_register_their_kinds_and_a_pool_can_be_created(url: str) -> None:
    assert len(CRD_FILES) == 3
    with pytest.raises(ApiError) as unknown:
        call(url, "GET", f"{DEFAULT}/rolloutpools")
    assert unknown.value.code == 404

    _apply_crds(url)

    crd = call(url, "GET", f"{CRDS}/rolloutpools.cadence.dev")
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"
    discovery = {r["name"]: r for r in call(url, "GET", CADENCE)["resources"]}
    assert {"rolloutpools", "rolloutgroups", "trainingruns", "rolloutgroups/scale"} <= set(
        discovery
    )
    assert discovery["rolloutpools"]["kind"] == "RolloutPool"
    assert discovery["rolloutpools"]["namespaced"] is True
    assert discovery["rolloutpools"]["shortNames"] == ["rpool"]
    assert discovery["rolloutpools/status"]["shortNames"] == []
    scale = discovery["rolloutgroups/scale"]
    assert (scale["group"], scale["version"], scale["kind"]) == ("autoscaling", "v1", "Scale")
    groups = call(url, "GET", "/apis")["groups"]
    assert "cadence.dev" in {group["name"] for group in groups}

    pool = example("RolloutPool")
    created = call(url, "POST", f"{DEFAULT}/rolloutpools", pool)
    assert created["metadata"]["namespace"] == "default"
    fetched = call(url, "GET", f"{DEFAULT}/rolloutpools/mixed")
    # Stored as written, with the schema's defaults filled in (as kube-apiserver does).
    assert [g["name"] for g in fetched["spec"]["groups"]] == ["h800", "a910x"]
    assert fetched["spec"]["image"] == IMAGE and fetched["spec"]["groups"][0]["minReplicas"] == 0
    listed = call(url, "GET", f"{DEFAULT}/rolloutpools")
    assert (listed["kind"], listed["apiVersion"]) == ("RolloutPoolList", "cadence.dev/v1alpha1")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["mixed"]
    with pytest.raises(ApiError) as conflict:
        call(url, "POST", f"{DEFAULT}/rolloutpools", pool)
    assert conflict.value.code == 409


def test_core_discovery_and_namespaces(url: str) -> None:
    core = call(url, "GET", "/api/v1")
    assert core["groupVersion"] == "v1"
    assert "namespaces" in {r["name"] for r in core["resources"]}
    namespaces = call(url, "GET", "/api/v1/namespaces")
    assert namespaces["kind"] == "NamespaceList"
    assert [ns["metadata"]["name"] for ns in namespaces["items"]] == ["default"]
    assert call(url, "GET", "/api/v1/namespaces/default")["kind"] == "Namespace"

    call(url, "POST", "/api/v1/namespaces", {"metadata": {"name": "team-a"}})
    assert call(url, "GET", "/api/v1/namespaces/team-a")["metadata"]["uid"]
    names = {ns["metadata"]["name"] for ns in call(url, "GET", "/api/v1/namespaces")["items"]}
    assert names == {"default", "team-a"}
    with pytest.raises(ApiError) as missing:
        call(url, "GET", "/api/v1/namespaces/nowhere")
    assert missing.value.code == 404


@pytest.mark.kubectl
def test_kubectl_applies_and_prints_the_printer_columns(kubectl: Callable[..., str]) -> None:
    applied = kubectl("apply", "-f", str(EXAMPLE))
    assert "rolloutpool.cadence.dev/mixed created" in applied
    assert "trainingrun.cadence.dev/digits created" in applied

    printed = kubectl("get", "rolloutpools,trainingruns")
    pools, runs = [
        [" ".join(line.split()) for line in table.splitlines()]
        for table in printed.strip().split("\n\n")
    ]
    assert pools[0] == "NAME READY WORKERS RUN VERSIONS TOK/S DEGRADED AGE"
    assert re.fullmatch(r"rolloutpool.cadence.dev/mixed \d+s", pools[1])
    assert runs[0] == "NAME POOL PHASE VERSION TOK/S P95 READY DEGRADED AGE"
    assert re.fullmatch(r"trainingrun.cadence.dev/digits mixed \d+s", runs[1])

    before = json.loads(kubectl("get", "rolloutpool", "mixed", "-o", "json"))
    again = kubectl("apply", "-f", str(EXAMPLE))
    # The run is unchanged; the pool's groups are a list the API server fills defaults
    # into, which a JSON merge patch replaces whole, so kubectl sends it again (as it does
    # on a cluster), and the stored spec stays the same.
    assert "trainingrun.cadence.dev/digits unchanged" in again
    after = json.loads(kubectl("get", "rolloutpool", "mixed", "-o", "json"))
    assert after["spec"] == before["spec"]

    # A watch: the listed pool once (not replayed by the watch), till the request times out.
    watched = kubectl("get", "rolloutpools", "--watch", "--request-timeout=1s").splitlines()
    assert [line.split()[0] for line in watched] == ["NAME", "mixed"]


def test_watch_streams_json_events_after_the_listed_version(cluster: str) -> None:
    pool = example("RolloutPool")
    call(cluster, "POST", f"{DEFAULT}/rolloutpools", pool)
    listed = call(cluster, "GET", f"{DEFAULT}/rolloutpools")["metadata"]["resourceVersion"]
    path = f"{DEFAULT}/rolloutpools?watch=true&resourceVersion={listed}"
    with urllib.request.urlopen(cluster + path, timeout=5) as stream:
        assert stream.headers["Content-Type"].startswith("application/json")
        call(cluster, "POST", f"{DEFAULT}/rolloutpools", {**pool, "metadata": {"name": "b"}})
        call(cluster, "PATCH", f"{DEFAULT}/rolloutpools/b", {"spec": {"image": "cadence:v2"}})
        first, second = json.loads(stream.readline()), json.loads(stream.readline())
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "b")
    assert (second["type"], second["object"]["spec"]["image"]) == ("MODIFIED", "cadence:v2")


@pytest.mark.kubectl
def test_printer_columns_show_status_values(cluster: str, kubectl: Callable[..., str]) -> None:
    kubectl("apply", "-f", str(EXAMPLE))
    status: dict[str, Any] = {"ready": "3/4", "workers": 4, "run": "digits", "versions": "5,6"}
    status["tokensPerSecond"] = 812.5
    call(cluster, "PATCH", f"{DEFAULT}/rolloutpools/mixed/status", {"status": status})
    lines = kubectl("get", "rpool", "mixed").splitlines()
    assert lines[1].split()[:6] == ["mixed", "3/4", "4", "digits", "5,6", "812.5"]


def test_objects_carry_server_set_metadata(cluster: str) -> None:
    pool = example("RolloutPool")
    meta = call(cluster, "POST", f"{DEFAULT}/rolloutpools", pool)["metadata"]
    assert len(meta["uid"]) == 36
    assert meta["generation"] == 1
    assert meta["creationTimestamp"].endswith("Z")
    created = int(meta["resourceVersion"])

    status = call(
        cluster, "PATCH", f"{DEFAULT}/rolloutpools/mixed/status", {"status": {"workers": 4}}
    )["metadata"]
    assert int(status["resourceVersion"]) > created
    assert status["generation"] == 1  # status is not the desired state
    assert (status["uid"], status["creationTimestamp"]) == (meta["uid"], meta["creationTimestamp"])

    spec = call(
        cluster, "PATCH", f"{DEFAULT}/rolloutpools/mixed", {"spec": {"image": "cadence:v2"}}
    )
    assert int(spec["metadata"]["resourceVersion"]) > int(status["resourceVersion"])
    assert spec["metadata"]["generation"] == 2

    other = call(cluster, "POST", f"{DEFAULT}/rolloutpools", {**pool, "metadata": {"name": "b"}})
    assert other["metadata"]["uid"] != meta["uid"]
    listed = call(cluster, "GET", f"{DEFAULT}/rolloutpools")
    assert int(listed["metadata"]["resourceVersion"]) >= int(other["metadata"]["resourceVersion"])


def test_a_json_patch_whose_test_fails_is_refused_with_422(cluster: str) -> None:
    """As kube-apiserver answers it: kopf then waits for the next event, where a 5xx has
    it re-send the same stale patch."""
    created = call(cluster, "POST", f"{DEFAULT}/rolloutpools", example("RolloutPool"))
    version = created["metadata"]["resourceVersion"]
    call(cluster, "PATCH", f"{DEFAULT}/rolloutpools/mixed/status", {"status": {"workers": 4}})
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {
            "op": "add",
            "path": "/metadata/finalizers",
            "value": ["kopf.zalando.org/KopfFinalizerMarker"],
        },
    ]
    with pytest.raises(ApiError) as stale:
        call(cluster, "PATCH", f"{DEFAULT}/rolloutpools/mixed", ops, "application/json-patch+json")
    assert stale.value.code == 422 and stale.value.status["reason"] == "Invalid"
    assert "finalizers" not in call(cluster, "GET", f"{DEFAULT}/rolloutpools/mixed")["metadata"]
    fresh = call(cluster, "GET", f"{DEFAULT}/rolloutpools/mixed")["metadata"]["resourceVersion"]
    ops[0]["value"] = fresh
    patched = call(
        cluster, "PATCH", f"{DEFAULT}/rolloutpools/mixed", ops, "application/json-patch+json"
    )
    assert patched["metadata"]["finalizers"] == ["kopf.zalando.org/KopfFinalizerMarker"]


def test_scale_maps_to_the_groups_replicas(cluster: str) -> None:
    group = {
        "apiVersion": "cadence.dev/v1alpha1",
        "kind": "RolloutGroup",
        "metadata": {"name": "mixed-h800"},
        "spec": {
            "pool": "mixed",
            "group": "h800",
            "accelerator": "H800",
            "affinity": 2,
            "replicas": 2,
        },
    }
    call(cluster, "POST", f"{DEFAULT}/rolloutgroups", group)
    selector = "cadence.dev/pool=mixed,cadence.dev/group=h800"
    call(
        cluster,
        "PATCH",
        f"{DEFAULT}/rolloutgroups/mixed-h800/status",
        {"status": {"replicas": 1, "selector": selector}},
    )
    path = f"{DEFAULT}/rolloutgroups/mixed-h800/scale"

    scale = call(cluster, "GET", path)
    assert (scale["apiVersion"], scale["kind"]) == ("autoscaling/v1", "Scale")
    assert scale["metadata"]["name"] == "mixed-h800"
    assert scale["spec"] == {"replicas": 2}
    assert scale["status"] == {"replicas": 1, "selector": selector}

    patched = call(cluster, "PATCH", path, {"spec": {"replicas": 5}})
    assert patched["kind"] == "Scale"
    assert patched["spec"] == {"replicas": 5}
    stored = call(cluster, "GET", f"{DEFAULT}/rolloutgroups/mixed-h800")
    assert stored["spec"]["replicas"] == 5
    assert stored["spec"]["accelerator"] == "H800"  # the rest of the spec is untouched

    put = call(cluster, "PUT", path, {**scale, "spec": {"replicas": 3}})
    assert put["spec"] == {"replicas": 3}
    assert call(cluster, "GET", path)["spec"] == {"replicas": 3}

    pool = example("RolloutPool")
    call(cluster, "POST", f"{DEFAULT}/rolloutpools", pool)
    with pytest.raises(ApiError) as no_scale:
        call(cluster, "GET", f"{DEFAULT}/rolloutpools/mixed/scale")
    assert no_scale.value.code == 404


@pytest.mark.kubectl
def test_kubectl_scale(cluster: str, kubectl: Callable[..., str]) -> None:
    group = {
        "apiVersion": "cadence.dev/v1alpha1",
        "kind": "RolloutGroup",
        "metadata": {"name": "g"},
        "spec": {"pool": "mixed", "group": "h800", "accelerator": "H800", "replicas": 2},
    }
    call(cluster, "POST", f"{DEFAULT}/rolloutgroups", group)
    assert "scaled" in kubectl("scale", "rolloutgroup/g", "--replicas=4")
    assert call(cluster, "GET", f"{DEFAULT}/rolloutgroups/g")["spec"]["replicas"] == 4


def test_a_kopf_operator_reacts_to_a_created_pool(cluster: str) -> None:
    registry = kopf.OperatorRegistry()
    seen: list[str] = []

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=cluster, insecure=True)

    @kopf.on.create("cadence.dev", "v1alpha1", "rolloutpools", registry=registry)
    def created(name: str, uid: str, patch: kopf.Patch, **_: Any) -> None:
        seen.append(name)
        patch.status["ready"] = "0/4"
        patch.status["run"] = uid

    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        # In a thread of its own: on stop, kopf cancels every task of its event loop.
        coro = kopf.operator(
            registry=registry, standalone=True, namespaces=["default"], stop_flag=stop
        )
        try:
            asyncio.run(coro)
        except BaseException as exc:
            errors.append(exc)

    operator = threading.Thread(target=run, daemon=True)
    operator.start()
    try:
        pool = example("RolloutPool")
        uid = call(cluster, "POST", f"{DEFAULT}/rolloutpools", pool)["metadata"]["uid"]
        path = f"{DEFAULT}/rolloutpools/mixed"
        status = eventually(
            lambda: call(cluster, "GET", path).get("status", {}).get("ready"),
            timeout_s=10,
            what="the status the operator's create handler wrote",
        )
        assert status == "0/4"
        assert call(cluster, "GET", path)["status"]["run"] == uid
        assert seen == ["mixed"]
    finally:
        stop.set()
        operator.join(timeout=10)
    assert not operator.is_alive()
    assert errors == []


def test_deleting_an_owner_deletes_its_dependents(url: str) -> None:
    maps = "/api/v1/namespaces/default/configmaps"

    def configmap(name: str, owner: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
        if owner is not None:
            ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"]}
            body["metadata"]["ownerReferences"] = [{**ref, "uid": owner["metadata"]["uid"]}]
        body["metadata"].update(meta)
        created: dict[str, Any] = call(url, "POST", maps, body)
        return created

    root = configmap("root")
    child = configmap("child", root)
    configmap("grandchild", child)
    configmap("held", root, finalizers=["example.com/hold"])
    configmap("bystander")
    call(url, "DELETE", f"{maps}/root")
    names = {m["metadata"]["name"] for m in call(url, "GET", maps)["items"]}
    assert names == {"held", "bystander"}  # the chain went, transitively
    held = call(url, "GET", f"{maps}/held")
    assert held["metadata"]["deletionTimestamp"]  # a finalizer holds it, marked
    call(url, "PATCH", f"{maps}/held", {"metadata": {"finalizers": []}})
    assert [m["metadata"]["name"] for m in call(url, "GET", maps)["items"]] == ["bystander"]


def test_a_pod_on_a_node_stays_terminating_until_deleted_with_no_grace(url: str) -> None:
    """As kube-apiserver does: deleting a pod bound to a node only marks it, so whoever
    lists pods sees it Terminating until its kubelet ends its process; a pod on no node
    goes at once, and so does one deleted with a grace of 0."""
    pods, maps = "/api/v1/namespaces/default/pods", "/api/v1/namespaces/default/configmaps"
    owner = call(
        url, "POST", maps, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "o"}}
    )
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": owner["metadata"]["uid"]}

    def pod(name: str, node: str | None, **meta: Any) -> None:
        spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
        if node is not None:
            spec.update(nodeName=node, terminationGracePeriodSeconds=45)
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **meta}, "spec": spec}
        call(url, "POST", pods, body)

    def names() -> set[str]:
        return {p["metadata"]["name"] for p in call(url, "GET", pods)["items"]}

    pod("bound", "node-a")
    pod("unbound", None)
    pod("owned", "node-a", ownerReferences=[ref])
    call(url, "DELETE", f"{pods}/bound")
    call(url, "DELETE", f"{pods}/unbound")
    call(url, "DELETE", f"{maps}/o")
    assert names() == {"bound", "owned"}
    for name in ("bound", "owned"):
        meta = call(url, "GET", f"{pods}/{name}")["metadata"]
        assert meta["deletionTimestamp"] and meta["deletionGracePeriodSeconds"] == 45
    call(url, "DELETE", f"{pods}/bound")  # asked again, with its grace: still there
    assert names() == {"bound", "owned"}
    call(url, "DELETE", f"{pods}/bound?gracePeriodSeconds=0")
    call(url, "DELETE", f"{pods}/owned", {"gracePeriodSeconds": 0})
    assert names() == set()


def test_generate_name_gives_each_object_its_own_name(url: str) -> None:
    maps = "/api/v1/namespaces/default/configmaps"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "event-"}}
    names = {call(url, "POST", maps, body)["metadata"]["name"] for _ in range(3)}
    assert len(names) == 3 and all(n.startswith("event-") for n in names)


BAD_POOLS = [
    # (a change to the example pool, the field the API server names)
    ({"groups.0.replicas": -1}, "spec.groups[0].replicas"),
    ({"groups.0.accelerator": "TPU-v9"}, "spec.groups[*]"),  # a CEL rule on each group
    ({"groups.0.engine": {"maxModelLen": "long"}}, "spec.groups[0].engine.maxModelLen"),
    # An integer below 0 where a quantity goes: the schema cannot say it, a rule does.
    ({"groups.0.resources": {"nvidia.com/gpu": -1}}, "a quantity is at least 0"),
]


def _kubectl_apply(
    cluster: str, tmp_path: Path, doc: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """`kubectl apply -f` of `doc` against the emulator, as a user would, unchecked."""
    (tmp_path / "doc.yaml").write_text(yaml.safe_dump(doc))
    config = write_kubeconfig(tmp_path / "kubeconfig", cluster)
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(config), "apply", "-f", str(tmp_path / "doc.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.kubectl
@pytest.mark.parametrize(("change", "field"), BAD_POOLS)
def test_kubectl_apply_of_an_invalid_pool_is_refused_naming_the_field(
    cluster: str, tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    """As on a cluster: the CRD's schema and CEL rules refuse the object, with its path."""
    pool = example("RolloutPool")
    for dotted, value in change.items():
        node = pool["spec"]
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[leaf] = value
    done = _kubectl_apply(cluster, tmp_path, pool)
    assert done.returncode != 0
    assert '"mixed" is invalid' in done.stderr and field in done.stderr, done.stderr
    with pytest.raises(ApiError) as missing:
        call(cluster, "GET", f"{DEFAULT}/rolloutpools/mixed")
    assert missing.value.code == 404


@pytest.mark.kubectl
def test_kubectl_apply_of_a_misspelt_field_is_refused_not_dropped(
    cluster: str, tmp_path: Path
) -> None:
    """kubectl validates on the server (`fieldValidation=Strict`, which the emulator's
    OpenAPI v3 offers as kube-apiserver's does): a field the schema lacks is refused by
    name, where pruning would have dropped it silently."""
    pool = example("RolloutPool")
    pool["spec"]["groups"][0]["replica"] = 3
    done = _kubectl_apply(cluster, tmp_path, pool)
    assert done.returncode != 0
    assert 'strict decoding error: unknown field "spec.groups[0].replica"' in done.stderr
    with pytest.raises(ApiError):
        call(cluster, "GET", f"{DEFAULT}/rolloutpools/mixed")


@pytest.mark.kubectl
def test_kubectl_apply_of_a_run_whose_hmin_is_not_a_number_is_refused(
    cluster: str, tmp_path: Path
) -> None:
    run = example("TrainingRun")
    run["spec"]["scheduler"]["hMin"] = "lots"
    done = _kubectl_apply(cluster, tmp_path, run)
    assert done.returncode != 0
    assert '"digits" is invalid' in done.stderr and "spec.scheduler.hMin" in done.stderr, (
        done.stderr
    )
    with pytest.raises(ApiError) as missing:
        call(cluster, "GET", f"{DEFAULT}/trainingruns/digits")
    assert missing.value.code == 404


def test_status_is_a_subresource(cluster: str) -> None:
    """A write to /status changes only status; a write to the object leaves its status."""
    call(cluster, "POST", f"{DEFAULT}/rolloutpools", example("RolloutPool"))
    url = f"{DEFAULT}/rolloutpools/mixed"
    call(cluster, "PATCH", url + "/status", {"status": {"workers": 4}, "spec": {"image": "x:1"}})
    call(cluster, "PATCH", url, {"status": {"workers": 9}, "spec": {"image": "cadence:v2"}})
    stored = call(cluster, "GET", url)
    assert (stored["status"]["workers"], stored["spec"]["image"]) == (4, "cadence:v2")
    # Unknown fields are pruned, as the structural schema says, not stored.
    call(cluster, "PATCH", url + "/status", {"status": {"nonsense": 1}})
    assert "nonsense" not in call(cluster, "GET", url)["status"]


def test_a_long_session_keeps_a_bounded_request_history_and_still_serves() -> None:
    """kmock rescans its request history per request; unbounded, a session of some
    thousand requests slowed every answer until callers timed out."""
    emulator = KubernetesEmulator()
    with serve(emulator) as url:
        _apply_crds(url)
        call(url, "POST", f"{DEFAULT}/rolloutpools", example("RolloutPool"))
        for _ in range(HISTORY + 50):
            call(url, "GET", f"{DEFAULT}/rolloutpools/mixed")
        assert emulator.remembered <= HISTORY
        # What it stores and records does not depend on the requests it forgot.
        assert call(url, "GET", f"{DEFAULT}/rolloutpools/mixed")["metadata"]["name"] == "mixed"
        assert sum(
            1 for a in emulator.audit if a[1:] == ("get", "cadence.dev", "rolloutpools")
        ) == (HISTORY + 51)


@pytest.mark.kubectl
def test_kubectl_create_of_a_built_in_kind_is_refused_saying_what_to_do(
    kubectl_result: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """kubectl sends built-in kinds as protobuf, which kmock cannot read: a 500 with an
    AttributeError, before."""
    done = kubectl_result("create", "secret", "generic", "s", "--from-literal=k=v")
    assert done.returncode != 0
    assert "reads JSON only" in done.stderr and "kubectl apply --validate=false" in done.stderr
