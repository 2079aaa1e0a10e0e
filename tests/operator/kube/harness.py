"""What the operator's tests against the Kubernetes emulator share: the example objects'
paths, reads of the emulator's state, the RBAC the operator's requests must be granted,
and the emulator and the operator each in a thread of its own, on real time. Tests that
run real processes (the kubelet stand-in's pods, `kubectl`) use these; tests that wait
only on the operator run it on fake time (`fake_cluster.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kopf
import yaml

from cadence.devcluster.emulator import ApiError, KubernetesEmulator, call, serve
from cadence.operator.kube.client import Kube
from cadence.operator.kube.handlers import Reconciler
from cadence.operator.kube.serve import operator_registry
from tests.helpers import ROOT, TRAINING_RUN, eventually

EXAMPLE = TRAINING_RUN
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NS = "/apis/cadence.dev/v1alpha1/namespaces/default"
PODS = "/api/v1/namespaces/default/pods"
# The operator's resync (every object reconciled again) in these tests: what a resync
# notices (a pool released, a run deleted) is seen within a second, not within 5 s.
TIMER_S = 0.3
# Waits on the operator: a chain of a few resyncs, on a loaded machine.
OPERATOR_S = 30.0


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


@contextlib.contextmanager
def operator_on(
    make: Callable[[Kube], Reconciler] = Reconciler, kube: KubernetesEmulator | None = None
) -> Iterator[str]:
    """The emulator and the operator against it; yields the emulator's URL."""
    with emulator(kube) as url, operator_thread(url, make):
        yield url


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
