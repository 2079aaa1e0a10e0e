"""The operator (kopf, `operator/kube/handlers.py`) against the test Kubernetes emulator: a
pool gets its RolloutGroups, a run binds it and gets its trainer, each group gets worker
pods with the labels, devices and owner a cluster needs, `/scale` on a group moves its
pods, an invalid pool is Degraded with the field and an Event while others go on, and a
second run on a busy pool waits saying why. `kubectl get` shows the printer columns."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from cadence.devcluster.emulator import ApiError, KubernetesEmulator, call, serve, write_kubeconfig
from cadence.operator.kube.client import Kube
from cadence.operator.kube.handlers import Reconciler
from cadence.operator.kube.serve import operator_registry
from tests.helpers import ROOT, TRAINING_RUN, eventually, example, reconciles_of

EXAMPLE = TRAINING_RUN
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NS = "/apis/cadence.dev/v1alpha1/namespaces/default"
PODS = "/api/v1/namespaces/default/pods"
# The operator's resync (every object reconciled again) in these tests: what a resync
# notices (a pool released, a run deleted) is seen within a second, not within 5 s.
TIMER_S = 0.3
# Waits on the operator: a chain of a few resyncs, on a loaded machine.
OPERATOR_S = 30.0
# A test against the operator takes seconds; the end-to-end ones say more.
pytestmark = pytest.mark.timeout(120)


def _pods(url: str, group: str | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = call(url, "GET", PODS)["items"]
    return [
        p
        for p in items
        if group is None or p["metadata"]["labels"].get("cadence.dev/group") == group
    ]


def _status(url: str, path: str) -> dict[str, Any]:
    found: dict[str, Any] = call(url, "GET", path).get("status") or {}
    return found


def _events(url: str, reason: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = call(url, "GET", "/api/v1/namespaces/default/events")["items"]
    return [e for e in items if e.get("reason") == reason]


@contextlib.contextmanager
def emulator(kube: KubernetesEmulator | None = None) -> Iterator[str]:
    """The test emulator with the CRDs applied; yields its URL."""
    with serve(kube if kube is not None else KubernetesEmulator()) as url:
        for path in sorted((ROOT / "crds").glob("*.cadence.dev.yaml")):
            call(url, "POST", CRDS, yaml.safe_load(path.read_text()))
        yield url


@contextlib.contextmanager
def operator_thread(
    url: str, make: Callable[[Kube], Reconciler] = Reconciler
) -> Iterator[Reconciler]:
    """The operator against `url`, its resync every TIMER_S, in a thread of its own (kopf
    cancels every task of its loop when it stops); yields its reconciler. Stopping it is
    an operator restart's first half."""
    stop = threading.Event()
    errors: list[BaseException] = []
    made: list[Reconciler] = []

    def run() -> None:
        async def main() -> None:
            kube = Kube(url)
            try:
                made.append(make(kube))
                await kopf.operator(
                    registry=operator_registry(kube, url, made[0], resync_s=TIMER_S),
                    standalone=True,
                    namespaces=["default"],
                    stop_flag=stop,
                )
            finally:
                await kube.aclose()

        try:
            asyncio.run(main())
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield eventually(
            lambda: made[0] if made else None, timeout_s=OPERATOR_S, what="the operator"
        )
    finally:
        stop.set()
        thread.join(timeout=20)
    assert not thread.is_alive() and errors == []


@dataclass
class Operated:
    """The emulator's URL and the operator's reconciler, whose handler runs it counts."""

    url: str
    reconciler: Reconciler

    def reconciled_again(self, plural: str, name: str, times: int = 2) -> None:
        """Wait until `name` has been reconciled `times` more times than now; with two, at
        least one of them started after this call (the first may have been under way)."""
        metrics = self.reconciler.metrics
        now = reconciles_of(metrics, plural, name)
        eventually(
            lambda: reconciles_of(metrics, plural, name) >= now + times,
            timeout_s=OPERATOR_S,
            what=f"{times} more reconciles of {plural}/{name} (after {now})",
        )


@contextlib.contextmanager
def operator_on(
    make: Callable[[Kube], Reconciler] = Reconciler, kube: KubernetesEmulator | None = None
) -> Iterator[Operated]:
    with emulator(kube) as url, operator_thread(url, make) as reconciler:
        yield Operated(url, reconciler)


RBAC = ROOT / "manifests" / "base" / "rbac.yaml"
NAMESPACED_RBAC = ROOT / "manifests" / "namespaced" / "role.yaml"


def _granted(path: Path, kind: str, name: str = "cadence-operator") -> set[tuple[str, str, str]]:
    role = next(
        d
        for d in yaml.safe_load_all(path.read_text())
        if d and d["kind"] == kind and d["metadata"]["name"] == name
    )
    return {
        (verb, group, resource)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# What kopf asks of the cluster, not of a namespace: a namespaced install's operator is
# refused it, which kopf logs once and works without (it notices new CRDs only at start).
SCANNING = {
    ("list", "apiextensions.k8s.io", "customresourcedefinitions"),
    ("watch", "apiextensions.k8s.io", "customresourcedefinitions"),
}


def _rbac_allows_what_the_operator_did(kube: KubernetesEmulator) -> None:
    """Every request the operator made (kopf's and its own client's) is one the shipped
    roles grant: the ClusterRole of the cluster-wide install, and the Role of the
    namespaced one (manifests/namespaced; these operators watch one namespace). The
    emulator checks no permissions, a cluster does."""
    done = {
        (verb, group, resource)
        for agent, verb, group, resource in kube.audit
        if agent.startswith(("kopf/", "cadence-operator"))
    }
    assert len(done) > 10  # the audit saw the operator at work
    assert done - _granted(RBAC, "ClusterRole") == set()
    assert done - _granted(NAMESPACED_RBAC, "Role") == set()


@pytest.fixture
def operated() -> Iterator[Operated]:
    with operator_on() as running:
        yield running


@pytest.fixture
def cluster(operated: Operated) -> str:
    return operated.url


def test_a_pool_and_a_run_get_groups_pods_and_a_trainer(cluster: str) -> None:
    pool = call(cluster, "POST", f"{NS}/rolloutpools", example("RolloutPool"))
    eventually(
        lambda: len(call(cluster, "GET", f"{NS}/rolloutgroups")["items"]) == 2,
        timeout_s=OPERATOR_S,
        what="the pool's two RolloutGroups",
    )
    groups = call(cluster, "GET", f"{NS}/rolloutgroups")["items"]
    assert sorted(g["metadata"]["name"] for g in groups) == ["mixed-a910x", "mixed-h800"]
    for g in groups:
        assert g["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]
    assert _pods(cluster) == []  # no run bound: a worker needs the run's model
    run = call(cluster, "POST", f"{NS}/trainingruns", example("TrainingRun"))
    eventually(lambda: len(_pods(cluster)) == 4, timeout_s=OPERATOR_S, what="4 worker pods")
    assert call(cluster, "GET", f"{NS}/rolloutpools/mixed")["status"]["run"] == "digits"
    h800 = sorted(_pods(cluster, "h800"), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["name"] for p in h800] == ["mixed-h800-0", "mixed-h800-1"]
    labels = h800[0]["metadata"]["labels"]
    assert (
        labels["cadence.dev/accelerator"] == "H800" and labels["cadence.dev/affinity-rank"] == "2"
    )
    assert labels["app.kubernetes.io/component"] == "worker"
    group_uid = next(g for g in groups if g["spec"]["group"] == "h800")["metadata"]["uid"]
    assert h800[0]["metadata"]["ownerReferences"][0]["uid"] == group_uid
    container = h800[0]["spec"]["containers"][0]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    for kind, path in (
        ("StatefulSet", "/apis/apps/v1/namespaces/default/statefulsets/digits-trainer"),
        ("Service", "/api/v1/namespaces/default/services/digits-trainer"),
        ("ConfigMap", "/api/v1/namespaces/default/configmaps/digits-trainer"),
    ):
        obj = call(cluster, "GET", path)
        assert obj["kind"] == kind
        assert obj["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
    # The workers take control calls from the operator, trainer and peers in the pool's
    # own namespace; a vLLM pool's workers may pull each other's KV caches.
    policy = call(
        cluster,
        "GET",
        "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/mixed-workers",
    )
    assert policy["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]
    assert policy["spec"]["podSelector"]["matchLabels"]["cadence.dev/pool"] == "mixed"
    assert [r["ports"][0]["port"] for r in policy["spec"]["ingress"]] == [8000, 8000, 5600]
    status = eventually(
        lambda: _status(cluster, f"{NS}/trainingruns/digits"),
        timeout_s=OPERATOR_S,
        what="the run's status",
    )
    # Bound, but no trainer answers and no pod is ready here: Starting, and Ready says why.
    assert status["phase"] == "Starting"
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "False" and "the trainer does not answer yet" in ready["message"]
    group = eventually(
        lambda: _status(cluster, f"{NS}/rolloutgroups/mixed-h800").get("selector"),
        timeout_s=OPERATOR_S,
        what="the h800 group's selector in its status",
    )
    assert group == "cadence.dev/pool=mixed,cadence.dev/group=h800"


def test_scale_on_a_group_moves_its_pods(operated: Operated) -> None:
    cluster = operated.url
    call(cluster, "POST", f"{NS}/rolloutpools", example("RolloutPool"))
    call(cluster, "POST", f"{NS}/trainingruns", example("TrainingRun"))

    def a910x(n: int) -> None:
        what = f"{n} a910x pods"
        eventually(lambda: len(_pods(cluster, "a910x")) == n, timeout_s=OPERATOR_S, what=what)

    a910x(2)
    group = f"{NS}/rolloutgroups/mixed-a910x"
    call(cluster, "PATCH", f"{group}/scale", {"spec": {"replicas": 3}})
    a910x(3)
    assert call(cluster, "GET", f"{group}/scale")["spec"]["replicas"] == 3
    call(cluster, "PATCH", f"{group}/scale", {"spec": {"replicas": 1}})
    a910x(1)
    assert len(_pods(cluster, "h800")) == 2  # the other group is its own
    # The pool's replicas were only the initial value: the pool re-applied and reconciled
    # again (it ensures its groups) leaves the group at the size it was scaled to.
    call(cluster, "PATCH", f"{NS}/rolloutpools/mixed", {"spec": example("RolloutPool")["spec"]})
    operated.reconciled_again("rolloutpools", "mixed")
    operated.reconciled_again("rolloutgroups", "mixed-a910x")
    assert call(cluster, "GET", group)["spec"]["replicas"] == 1
    assert call(cluster, "GET", f"{group}/scale")["spec"]["replicas"] == 1
    assert len(_pods(cluster, "a910x")) == 1
    assert call(cluster, "GET", f"{NS}/rolloutpools/mixed")["spec"]["groups"][1]["replicas"] == 2


def test_an_invalid_pool_is_degraded_with_an_event_and_others_go_on(operated: Operated) -> None:
    cluster = operated.url
    bad = example("RolloutPool")
    bad["metadata"]["name"] = "broken"
    # What the CRD's schema admits and the model refuses (a map's keys are checked by the
    # model only: a CEL rule over them can exceed the API server's cost budget).
    bad["spec"]["groups"][0]["nodeSelector"] = {"bad key!": "x"}
    call(cluster, "POST", f"{NS}/rolloutpools", bad)
    call(cluster, "POST", f"{NS}/rolloutpools", example("RolloutPool"))
    conditions = eventually(
        lambda: _status(cluster, f"{NS}/rolloutpools/broken").get("conditions"),
        timeout_s=OPERATOR_S,
        what="the broken pool's conditions",
    )
    degraded = next(c for c in conditions if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "Invalid"
    name = bad["spec"]["groups"][0]["name"]
    assert degraded["message"].startswith(f"spec.groups[{name}].nodeSelector: node selector key")
    events = eventually(
        lambda: _events(cluster, "Invalid"), timeout_s=OPERATOR_S, what="an Invalid event"
    )
    assert events[0]["involvedObject"]["name"] == "broken" and events[0]["type"] == "Warning"
    # Its resync retries it, and finds it as invalid: the same reason is not announced again.
    operated.reconciled_again("rolloutpools", "broken", times=3)
    assert len(_events(cluster, "Invalid")) == 1
    groups = eventually(
        lambda: call(cluster, "GET", f"{NS}/rolloutgroups")["items"],
        timeout_s=OPERATOR_S,
        what="the valid pool's groups",
    )
    assert {g["spec"]["pool"] for g in groups} == {"mixed"}  # the valid pool went on


def test_a_run_too_long_for_a_group_is_degraded_naming_it(cluster: str) -> None:
    pool = example("RolloutPool")
    pool["spec"]["groups"][1]["engine"] = {"tensorParallel": 1, "maxModelLen": 200000}
    call(cluster, "POST", f"{NS}/rolloutpools", pool)
    run = example("TrainingRun")
    run["spec"]["model"]["catalog"] = "Qwen3-32B"
    call(cluster, "POST", f"{NS}/trainingruns", run)
    status = eventually(
        lambda: _status(cluster, f"{NS}/trainingruns/digits").get("conditions"),
        timeout_s=OPERATOR_S,
        what="the run's conditions",
    )
    degraded = next(c for c in status if c["type"] == "Degraded")
    assert degraded["status"] == "True"
    assert degraded["message"].startswith("spec.model: Qwen3-32B on this pool: KV capacity")
    assert "a910x (" in degraded["message"]
    assert _status(cluster, f"{NS}/rolloutpools/mixed").get("run") is None  # not bound
    assert _pods(cluster) == []


def test_a_second_run_on_a_busy_pool_waits_saying_why(operated: Operated) -> None:
    cluster = operated.url
    call(cluster, "POST", f"{NS}/rolloutpools", example("RolloutPool"))
    call(cluster, "POST", f"{NS}/trainingruns", example("TrainingRun"))
    eventually(
        lambda: _status(cluster, f"{NS}/rolloutpools/mixed").get("run") == "digits",
        timeout_s=OPERATOR_S,
        what="the pool bound to the first run",
    )
    second = example("TrainingRun")
    second["metadata"]["name"] = "digits-2"
    call(cluster, "POST", f"{NS}/trainingruns", second)
    status = eventually(
        lambda: _status(cluster, f"{NS}/trainingruns/digits-2"),
        timeout_s=OPERATOR_S,
        what="the second run's status",
    )
    assert status["phase"] == "Waiting"
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] == "PoolBusy" and "serves TrainingRun digits" in ready["message"]
    waiting = eventually(
        lambda: _events(cluster, "Waiting"), timeout_s=OPERATOR_S, what="a Waiting event"
    )
    assert waiting[0]["involvedObject"]["name"] == "digits-2"
    operated.reconciled_again("trainingruns", "digits-2", times=3)  # still waiting: said once
    assert len(_events(cluster, "Waiting")) == 1


def test_deleting_a_run_removes_its_children_and_the_pool_serves_the_next() -> None:
    kube = KubernetesEmulator()
    with operator_on(kube=kube) as operated:
        _delete_a_run(operated.url)
    _rbac_allows_what_the_operator_did(kube)


def _delete_a_run(cluster: str) -> None:
    call(cluster, "POST", f"{NS}/rolloutpools", example("RolloutPool"))
    call(cluster, "POST", f"{NS}/trainingruns", example("TrainingRun"))
    eventually(lambda: len(_pods(cluster)) == 4, timeout_s=OPERATOR_S, what="4 worker pods")
    second = example("TrainingRun")
    second["metadata"]["name"] = "digits-2"
    call(cluster, "POST", f"{NS}/trainingruns", second)
    eventually(
        lambda: _status(cluster, f"{NS}/trainingruns/digits-2").get("phase") == "Waiting",
        timeout_s=OPERATOR_S,
        what="the second run Waiting",
    )
    call(cluster, "DELETE", f"{NS}/trainingruns/digits")
    trainer = [
        f"/{kind}/digits-trainer"
        for kind in (
            "apis/apps/v1/namespaces/default/statefulsets",
            "api/v1/namespaces/default/services",
            "api/v1/namespaces/default/configmaps",
        )
    ]
    eventually(  # owner references
        lambda: all(_get(cluster, p) is None for p in trainer),
        timeout_s=OPERATOR_S,
        what="the deleted run's trainer objects gone",
    )
    eventually(
        lambda: _status(cluster, f"{NS}/rolloutpools/mixed").get("run") == "digits-2",
        timeout_s=OPERATOR_S,
        what="the pool bound to the second run",
    )
    # The old run's workers went; the pool's groups have pods of the new run.
    eventually(
        lambda: (
            sorted(p["metadata"]["labels"]["cadence.dev/run"] for p in _pods(cluster))
            == ["digits-2"] * 4
        ),
        timeout_s=OPERATOR_S,
        what="4 pods, all of the second run",
    )
    assert _get(cluster, "/apis/apps/v1/namespaces/default/statefulsets/digits-2-trainer")
    reasons = {
        e.get("reason") for e in call(cluster, "GET", "/api/v1/namespaces/default/events")["items"]
    }
    assert {"Released", "Retired", "Bound"} <= reasons
    # Deleting the pool takes its groups, their pods, its Service and Secret.
    call(cluster, "DELETE", f"{NS}/rolloutpools/mixed")
    eventually(
        lambda: call(cluster, "GET", f"{NS}/rolloutgroups")["items"] == [],
        timeout_s=OPERATOR_S,
        what="the deleted pool's groups gone",
    )
    assert _pods(cluster) == []
    assert _get(cluster, "/api/v1/namespaces/default/secrets/cadence-token") is None
    assert _get(cluster, "/api/v1/namespaces/default/services/mixed-workers") is None


KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


def test_no_object_waits_on_the_operator_to_be_deleted() -> None:
    """Issue 17, item 10: nothing Cadence makes carries a finalizer (an earlier version's
    is taken off), so with the operator stopped a pool and a run still delete, and the
    garbage collector takes their children."""
    with emulator() as url:
        old = example("RolloutPool")
        old["metadata"]["finalizers"] = [KOPF_FINALIZER]  # as an earlier operator left it
        call(url, "POST", f"{NS}/rolloutpools", old)
        with operator_thread(url) as reconciler:
            call(url, "POST", f"{NS}/trainingruns", example("TrainingRun"))
            eventually(lambda: len(_pods(url)) == 4, timeout_s=OPERATOR_S, what="4 pods")
            eventually(
                lambda: ("default", "digits") in reconciler.controlling,
                timeout_s=OPERATOR_S,
                what="the run's control loop",
            )
            eventually(
                lambda: (
                    not call(url, "GET", f"{NS}/rolloutpools/mixed")["metadata"].get("finalizers")
                ),
                timeout_s=OPERATOR_S,
                what="the old finalizer taken off",
            )
            call(url, "DELETE", f"{NS}/trainingruns/digits")
            eventually(  # its DELETED event ends its loop; no finalizer waits for that
                lambda: ("default", "digits") not in reconciler.controlling,
                timeout_s=OPERATOR_S,
                what="the deleted run's loop ended",
            )
            call(url, "POST", f"{NS}/trainingruns", example("TrainingRun"))
            eventually(
                lambda: _status(url, f"{NS}/trainingruns/digits").get("phase") == "Starting",
                timeout_s=OPERATOR_S,
                what="the run made again, Starting",
            )
        for plural in ("rolloutpools", "rolloutgroups", "trainingruns"):
            for obj in call(url, "GET", f"{NS}/{plural}")["items"]:
                assert not obj["metadata"].get("finalizers"), obj["metadata"]["name"]
        call(url, "DELETE", f"{NS}/trainingruns/digits")
        call(url, "DELETE", f"{NS}/rolloutpools/mixed")
        assert _get(url, f"{NS}/trainingruns/digits") is None
        assert _get(url, f"{NS}/rolloutpools/mixed") is None
        assert call(url, "GET", f"{NS}/rolloutgroups")["items"] == []
        assert _pods(url) == []


@pytest.mark.kubectl
def test_kubectl_shows_the_columns(cluster: str, tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", cluster)
    kubectl = ["kubectl", "--kubeconfig", str(config)]
    subprocess.run([*kubectl, "apply", "-f", str(EXAMPLE)], check=True, capture_output=True)
    eventually(
        lambda: _status(cluster, f"{NS}/trainingruns/digits").get("phase"),
        timeout_s=OPERATOR_S,
        what="the run's phase",
    )
    eventually(
        lambda: _status(cluster, f"{NS}/rolloutpools/mixed").get("ready"),
        timeout_s=OPERATOR_S,
        what="the pool's ready count",
    )
    out = subprocess.run(
        [*kubectl, "get", "rolloutpools,rolloutgroups,trainingruns"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    print(out)  # docs/kubernetes.md quotes it
    lines = [line.split() for line in out.splitlines() if line.strip()]
    assert lines[0] == ["NAME", "READY", "WORKERS", "RUN", "VERSIONS", "TOK/S", "DEGRADED", "AGE"]
    assert lines[1][0] == "rolloutpool.cadence.dev/mixed"
    assert lines[1][-2] == "False"  # Degraded, from its condition
    header = ["NAME", "POOL", "PHASE", "VERSION", "TOK/S", "P95", "READY", "DEGRADED", "AGE"]
    assert header in lines
    run_row = next(line for line in lines if line[0] == "trainingrun.cadence.dev/digits")
    assert run_row[1:3] == ["mixed", "Starting"]  # no trainer answers here


def _ledger_is_whole(ledger: Path, samples: int) -> None:
    db = sqlite3.connect(ledger)
    states = dict(db.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall())
    assert states == {"consumed": samples}  # every admitted sample ended
    accepted = db.execute(
        "SELECT COUNT(*), COUNT(DISTINCT id) FROM arrivals WHERE outcome = 'accepted'"
    ).fetchone()
    assert accepted == (samples, samples)  # once: no attempt accepted twice


def _monitoring_reads_real_metrics(scraped: str) -> None:
    """Every metric the shipped dashboard and HPA name is one the operator, a worker or
    the trainer exports (`scraped`: their /metrics, concatenated)."""
    exported = {
        line.split("{")[0].split(" ")[0]
        for line in scraped.splitlines()
        if line and not line.startswith("#")
    }
    monitoring = ROOT / "manifests" / "monitoring" / "grafana-dashboard.yaml"
    dashboard = json.loads(yaml.safe_load(monitoring.read_text())["data"]["cadence.json"])
    named = {
        name
        for panel in dashboard["panels"]
        for name in re.findall(r"cadence_[a-z_]+", panel["targets"][0]["expr"])
    }
    hpa = yaml.safe_load((ROOT / "manifests" / "autoscaling" / "hpa.yaml").read_text())
    named.add(hpa["spec"]["metrics"][0]["external"]["metric"]["name"])
    assert len(named) >= 8 and named <= exported, named - exported


def _get(url: str, path: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = call(url, "GET", path)
    except ApiError:
        return None
    return found
