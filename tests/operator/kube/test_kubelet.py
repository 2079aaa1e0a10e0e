"""The operator's pods as a kubelet runs them (`kubelet.py`): a pool and a run on the
test emulator, every worker and the trainer started from the pod specs the operator
wrote (command, arguments, env from the Secret, volumes, ports, probes), reached at
their pod IPs and Service names; the run trains to its last version. A pod spec broken
on purpose (no token, a wrong probe path) fails there, as it would on a cluster."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cadence.operator.kube import children
from cadence.operator.kube.client import Kube
from cadence.operator.kube.handlers import Reconciler
from tests.helpers import documents, eventually

from .k8s_emulator import call
from .kubelet import Kubelet, available
from .test_operator import EXAMPLE, NS, PODS, emulator, operator_thread

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not available(), reason="needs root and iproute2 for pod namespaces"),
]


def _docs(iterations: int) -> dict[str, dict[str, Any]]:
    """The example pool and run, with workers on the emulated engine (this node has no
    accelerator) and the weights from a claim the node holds."""
    docs = documents(EXAMPLE)
    for group in docs["RolloutPool"]["spec"]["groups"]:
        group.setdefault("engine", {})["backend"] = "emulated"
    run = docs["TrainingRun"]["spec"]
    run["batch"]["iterations"] = iterations
    run["model"] = {"uri": "pvc://models", "catalog": run["model"].get("catalog", "Qwen3-8B")}
    return docs


@contextlib.contextmanager
def on_node(tmp_path: Path, model: Path) -> Iterator[tuple[str, Kubelet]]:
    """The emulator, a node running its pods (the weights' claim is `model`), and the
    operator, which reaches the trainer through the node's Service names."""
    with emulator() as url, Kubelet(url, tmp_path / "node", claims={"models": model}) as node:

        def make(kube: Kube) -> Reconciler:
            return Reconciler(kube, status_every_s=0.5, transport=node.transport())

        with operator_thread(url, make):
            yield url, node
        assert node.errors == []


def _pod(url: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = call(url, "GET", f"{PODS}/{name}")
    return found


def test_a_run_trains_on_pods_the_kubelet_runs_from_their_specs(
    tmp_path: Path, tiny_model: Path
) -> None:
    docs = _docs(iterations=3)
    with on_node(tmp_path, tiny_model) as (url, node):
        call(url, "POST", f"{NS}/rolloutpools", docs["RolloutPool"])
        call(url, "POST", f"{NS}/trainingruns", docs["TrainingRun"])
        ready = eventually(
            lambda: (
                len(pods := call(url, "GET", PODS)["items"]) == 5
                and all(
                    c["status"] == "True"
                    for p in pods
                    for c in (p.get("status") or {}).get("conditions", [])
                    if c["type"] == "Ready"
                )
                and all((p.get("status") or {}).get("conditions") for p in pods)
                and pods
            ),
            timeout_s=240,
            what="4 workers and the trainer Ready by their readiness probes",
        )
        assert {p["status"]["podIP"] for p in ready} <= {
            f"{node.subnet}.{i}" for i in range(2, 250)
        }
        status = eventually(
            lambda: (
                (s := call(url, "GET", f"{NS}/trainingruns/digits").get("status") or {}).get(
                    "phase"
                )
                == "Succeeded"
                and s
            ),
            timeout_s=300,
            what=f"the run Succeeded; trainer log: {node.log('digits-trainer-0')[-2000:]}",
        )
        restarts = {
            p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
            for p in call(url, "GET", PODS)["items"]
        }
    assert status["policyVersion"] == 3
    assert set(restarts.values()) == {0}, restarts
    ledger = tmp_path / "node" / "claims" / "state-digits-trainer-0" / "ledger.db"
    states = dict(
        sqlite3.connect(ledger)
        .execute("SELECT state, COUNT(*) FROM samples GROUP BY state")
        .fetchall()
    )
    assert states == {"consumed": 3 * 8 * 8}


def test_scale_in_mid_run_drains_the_pod_by_sigterm_and_loses_nothing(
    tmp_path: Path, tiny_model: Path
) -> None:
    """`/scale` down mid-run: the operator deletes the chosen pod, the node sends it
    SIGTERM, the worker drains (its parked samples move) and exits within its grace; the
    run finishes with every admitted sample consumed once."""
    docs = _docs(iterations=6)
    with on_node(tmp_path, tiny_model) as (url, node):
        call(url, "POST", f"{NS}/rolloutpools", docs["RolloutPool"])
        call(url, "POST", f"{NS}/trainingruns", docs["TrainingRun"])
        eventually(
            lambda: (
                (call(url, "GET", f"{NS}/trainingruns/digits").get("status") or {}).get(
                    "policyVersion", 0
                )
                >= 2
            ),
            timeout_s=240,
            what="the run at version 2",
        )
        call(url, "PATCH", f"{NS}/rolloutgroups/mixed-a910x/scale", {"spec": {"replicas": 1}})
        (gone,) = eventually(
            lambda: list(node.ended), timeout_s=120, what="a scaled-in pod's process ended"
        )
        eventually(
            lambda: (
                (call(url, "GET", f"{NS}/trainingruns/digits").get("status") or {}).get("phase")
                == "Succeeded"
            ),
            timeout_s=300,
            what="the run Succeeded after the scale-in",
        )
    assert gone.startswith("mixed-a910x-")
    assert node.ended[gone] == ("exited", 0), node.log(gone)[-1500:]
    ledger = tmp_path / "node" / "claims" / "state-digits-trainer-0" / "ledger.db"
    db = sqlite3.connect(ledger)
    states = dict(db.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall())
    assert states == {"consumed": 6 * 8 * 8}
    accepted = db.execute(
        "SELECT COUNT(*), COUNT(DISTINCT id) FROM arrivals WHERE outcome = 'accepted'"
    ).fetchone()
    assert accepted == (6 * 8 * 8, 6 * 8 * 8)


def _broken(change: Callable[[dict[str, Any]], None]) -> Callable[..., dict[str, Any]]:
    made = children.worker_pod

    def worker_pod(*args: Any, **kwargs: Any) -> dict[str, Any]:
        pod = made(*args, **kwargs)
        change(pod["spec"]["containers"][0])
        return pod

    return worker_pod


def _no_token(container: dict[str, Any]) -> None:
    container["env"] = [e for e in container["env"] if e["name"] != "CADENCE_TOKEN"]


def _wrong_port(container: dict[str, Any]) -> None:
    container["ports"][0]["containerPort"] = 8001  # the process listens on --port 8000


def _wrong_probe(container: dict[str, Any]) -> None:
    container["readinessProbe"]["httpGet"]["path"] = "/ready"


def test_a_worker_pod_without_its_token_crashes_on_the_node(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(children, "worker_pod", _broken(_no_token))
    with one_worker(tmp_path, tiny_model) as (url, node):
        status = eventually(
            lambda: (
                (st := _pod(url, WORKER)["status"]["containerStatuses"][0])["restartCount"] and st
            ),
            timeout_s=120,
            what=f"the worker restarted; its log: {node.log(WORKER)[-1500:]}",
        )
    assert status["lastState"]["terminated"]["exitCode"] != 0 and not status["ready"]
    assert "CADENCE_TOKEN" in node.log(WORKER)


@pytest.mark.parametrize("change", [_wrong_probe, _wrong_port], ids=["probe-path", "port"])
def test_a_worker_pod_probed_where_it_does_not_answer_is_never_ready(
    tmp_path: Path,
    tiny_model: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[dict[str, Any]], None],
) -> None:
    """The process serves (on port 8000), yet its readiness probe keeps failing: the
    pod is never Ready, so the group never is."""
    monkeypatch.setattr(children, "worker_pod", _broken(change))
    with one_worker(tmp_path, tiny_model) as (url, node):
        eventually(
            lambda: node.serving(WORKER, children.CONTROL_PORT),
            timeout_s=120,
            what=f"the worker serving; its log: {node.log(WORKER)[-1500:]}",
        )
        failed = node.readiness_failures(WORKER)
        eventually(
            lambda: node.readiness_failures(WORKER) >= failed + 3,
            timeout_s=60,
            what="three more readiness probes failing while it serves",
        )
        assert not _pod(url, WORKER)["status"]["containerStatuses"][0]["ready"]


WORKER = "mixed-h800-0"


@contextlib.contextmanager
def one_worker(tmp_path: Path, model: Path) -> Iterator[tuple[str, Kubelet]]:
    """A pool of one worker and a run, on the node."""
    docs = _docs(iterations=3)
    docs["RolloutPool"]["spec"]["groups"] = docs["RolloutPool"]["spec"]["groups"][:1]
    docs["RolloutPool"]["spec"]["groups"][0]["replicas"] = 1
    with on_node(tmp_path, model) as (url, node):
        call(url, "POST", f"{NS}/rolloutpools", docs["RolloutPool"])
        call(url, "POST", f"{NS}/trainingruns", docs["TrainingRun"])
        yield url, node
