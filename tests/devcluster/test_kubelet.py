"""The operator's pods as a kubelet runs them (`kubelet.py`): a pool and a run on the
test emulator, every worker and the trainer started from the pod specs the operator
wrote (command, arguments, env from the Secret, volumes, ports, probes), reached at
their pod IPs and Service names; the run trains to its last version. A pod spec broken
on purpose (no token, a wrong probe path) fails there, as it would on a cluster."""

from __future__ import annotations

import base64
import contextlib
import sqlite3
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from cadence.common.trace import read as read_trace
from cadence.devcluster.emulator import KubernetesEmulator, call, write_kubeconfig
from cadence.devcluster.kubelet import Kubelet, available
from cadence.operator.kube import children
from cadence.operator.kube.client import Kube
from cadence.operator.kube.handlers import Reconciler
from tests.helpers import documents, eventually
from tests.operator.kube.harness import (
    EXAMPLE,
    NS,
    OPERATOR_S,
    PODS,
    _events,
    _get,
    _ledger_is_whole,
    _monitoring_reads_real_metrics,
    _rbac_allows_what_the_operator_did,
    _status,
    emulator,
    operator_thread,
)

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


def _reconciler(node: Kubelet, traces: Path | None = None) -> Callable[[Kube], Reconciler]:
    def make(kube: Kube) -> Reconciler:
        return Reconciler(kube, status_every_s=0.5, transport=node.transport(), trace_dir=traces)

    return make


@contextlib.contextmanager
def node_only(
    tmp_path: Path, model: Path, kube: KubernetesEmulator | None = None
) -> Iterator[tuple[str, Kubelet]]:
    """The emulator and a node running its pods (the weights' claim is `model`)."""
    with emulator(kube) as url, Kubelet(url, tmp_path / "node", claims={"models": model}) as node:
        yield url, node
        assert node.errors == []


@contextlib.contextmanager
def on_node(
    tmp_path: Path, model: Path, kube: KubernetesEmulator | None = None
) -> Iterator[tuple[str, Kubelet, Reconciler]]:
    """The node and the operator, which reaches the trainer through the node's Service
    names, as a client in the cluster would."""
    with (
        node_only(tmp_path, model, kube) as (url, node),
        operator_thread(url, _reconciler(node, tmp_path / "traces")) as reconciler,
    ):
        yield url, node, reconciler


def _pod(url: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = call(url, "GET", f"{PODS}/{name}")
    return found


class Watcher(threading.Thread):
    """Polls every worker pod's state (at its pod IP, with the pool's token) while a run
    goes on, and records any trajectory found resident on two workers at once."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.doubles: list[tuple[str, list[str]]] = []
        self.polls = 0
        self.residents = 0  # seen over all polls: the watcher saw work, not errors
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            self._watch()
        except BaseException as e:
            self.errors.append(e)

    def _watch(self) -> None:
        secret = eventually(
            lambda: _get(self.url, "/api/v1/namespaces/default/secrets/cadence-token"),
            timeout_s=OPERATOR_S,
            what="the pool's token Secret",
        )
        token = base64.b64decode(secret["data"]["token"]).decode()
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=5.0) as http:
            while not self.stop.is_set():
                where: dict[str, list[str]] = {}
                for pod in call(self.url, "GET", PODS)["items"]:
                    ip = (pod.get("status") or {}).get("podIP")
                    if pod["metadata"]["labels"].get("app.kubernetes.io/component") != "worker":
                        continue
                    if not ip:
                        continue
                    try:
                        answer = http.get(f"http://{ip}:{children.CONTROL_PORT}/v1/state")
                    except httpx.TransportError:
                        continue  # starting, or gone
                    if answer.status_code == 503:
                        continue  # not ready yet
                    state = answer.raise_for_status().json()
                    self.residents += len(state["residents"])
                    for r in state["residents"]:
                        where.setdefault(r["id"], []).append(pod["metadata"]["name"])
                self.doubles += [(t, ws) for t, ws in where.items() if len(ws) > 1]
                self.polls += 1
                self.stop.wait(0.05)


@contextlib.contextmanager
def watching(url: str) -> Iterator[Watcher]:
    watcher = Watcher(url)
    watcher.start()
    try:
        yield watcher
    finally:
        watcher.stop.set()
        watcher.join(timeout=10)


def _run(url: str) -> dict[str, Any]:
    found: dict[str, Any] = call(url, "GET", f"{NS}/trainingruns/digits").get("status") or {}
    return found


def _ledger(tmp_path: Path) -> Path:
    return tmp_path / "node" / "claims" / "state-digits-trainer-0" / "ledger.db"


def _succeeded(url: str, node: Kubelet, tmp_path: Path, *, timeout_s: float, what: str) -> Any:
    """The run's status once it Succeeded. On a timeout the failure says where the run
    stood: its status, the ledger's samples by state, the trainer's last log lines."""
    try:
        return eventually(
            lambda: _run(url).get("phase") == "Succeeded" and _run(url),
            timeout_s=timeout_s,
            what=what,
        )
    except pytest.fail.Exception as e:
        with sqlite3.connect(f"file:{_ledger(tmp_path)}?mode=ro", uri=True) as db:
            states = dict(db.execute("SELECT state, count(*) FROM samples GROUP BY state"))
        trainer = node.log("digits-trainer-0")[-1500:]
        pytest.fail(f"{e}\nstatus: {_run(url)}\nledger: {states}\ntrainer log: {trainer}")


def _all_ready(url: str, count: int) -> list[dict[str, Any]] | None:
    pods: list[dict[str, Any]] = call(url, "GET", PODS)["items"]
    ready = [
        p
        for p in pods
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions", [])
        )
    ]
    return pods if len(pods) == count and len(ready) == count else None


@pytest.mark.kubectl
def test_a_run_trains_on_pods_the_kubelet_runs_from_their_specs(
    tmp_path: Path, tiny_model: Path
) -> None:
    """End to end: the operator reaches workers at their pod IPs and the trainer at its
    Service name; the run trains to its last version. Mid-run, `kubectl get` shows the
    pool's readiness, versions and throughput, the operator's metrics each group's
    workers and demand; every metric the dashboard and HPA name is exported."""
    iterations = 8  # long enough for the pool to show the run mid-run
    docs = _docs(iterations)
    kube = KubernetesEmulator()
    a910x = 'cadence_group_workers{namespace="default",pool="mixed",rolloutgroup="mixed-a910x"}'
    with on_node(tmp_path, tiny_model, kube) as (url, node, reconciler):
        call(url, "POST", f"{NS}/rolloutpools", docs["RolloutPool"])
        call(url, "POST", f"{NS}/trainingruns", docs["TrainingRun"])
        ready = eventually(
            lambda: _all_ready(url, 5),
            timeout_s=240,
            what="4 workers and the trainer Ready by their readiness probes",
        )
        assert {p["status"]["podIP"] for p in ready} <= {
            f"{node.subnet}.{i}" for i in range(2, 250)
        }
        registry = CollectorRegistry()
        registry.register(reconciler.metrics)
        scraped = eventually(
            lambda: (
                text if f"{a910x} 2.0" in (text := generate_latest(registry).decode()) else None
            ),
            timeout_s=60,
            what="the operator's metrics showing the a910x group's 2 workers",
        )
        groups = eventually(
            lambda: (
                all((g.get("status") or {}).get("versions") for g in items)
                and [g["status"] for g in items]
                if (items := call(url, "GET", f"{NS}/rolloutgroups")["items"])
                else None
            ),
            timeout_s=60,
            what="every group's status showing its versions",
        )
        eventually(
            lambda: (
                (pool := _status(url, f"{NS}/rolloutpools/mixed")).get("tokensPerSecond")
                and pool.get("versions")
                and pool.get("ready") == "4/4"
            ),
            timeout_s=60,
            what="the pool's status showing throughput, versions and 4/4 ready",
        )
        config = write_kubeconfig(tmp_path / "kubeconfig", url)
        shown = subprocess.run(
            [
                "kubectl",
                "--kubeconfig",
                str(config),
                "get",
                "rolloutpools,rolloutgroups,trainingruns",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        print(shown)  # docs/kubernetes.md quotes it
        worker = next(p for p in ready if p["metadata"]["name"] == "mixed-h800-0")
        scraped += httpx.get(
            f"http://{worker['status']['podIP']}:{children.CONTROL_PORT}/metrics"
        ).text
        scraped += httpx.get(
            node.url_of(f"http://digits-trainer:{children.TRAINER_PORT}/metrics")
        ).text
        status = _succeeded(url, node, tmp_path, timeout_s=300, what="the run Succeeded")
        eventually(  # a finished run frees its pool
            lambda: _status(url, f"{NS}/rolloutpools/mixed").get("run") is None,
            timeout_s=OPERATOR_S,
            what="the finished run's pool released",
        )

        def events_once_released() -> list[dict[str, Any]]:
            items = call(url, "GET", "/api/v1/namespaces/default/events")["items"]
            return items if any(e["reason"] == "Released" for e in items) else []

        # Posted after the handler that released the pool returns.
        events = eventually(events_once_released, timeout_s=OPERATOR_S, what="Released")
        restarts = {
            p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
            for p in call(url, "GET", PODS)["items"]
        }
    assert status["policyVersion"] == iterations and status["step"] == iterations
    assert set(restarts.values()) == {0}, restarts
    rows = [line.split() for line in shown.splitlines()]
    pool_row = next(r for r in rows if r and r[0] == "rolloutpool.cadence.dev/mixed")
    assert pool_row[1:4] == ["4/4", "4", "digits"] and float(pool_row[5]) > 0
    assert 'cadence_loop_cycles_total{namespace="default",trainingrun="digits"}' in scraped
    pending = 'cadence_group_pending_trajectories{namespace="default",pool="mixed",'
    assert f'{pending}rolloutgroup="mixed-h800"}}' in scraped
    for g in groups:  # what the loop saw, per group
        assert g["headroomTokens"] > 0 and "pendingTrajectories" in g and "meanContext" in g
    assert {"Bound", "Succeeded", "Released"} <= {e["reason"] for e in events}
    assert reconciler.metrics.runs == {}  # a finished run's series went with its loop
    _rbac_allows_what_the_operator_did(kube)
    _monitoring_reads_real_metrics(scraped)
    assert status["tokensPerSecond"] > 0 and 0 < status["latencyP50S"] <= status["latencyP95S"]
    assert status["tokensPerDollar"] > 0
    _ledger_is_whole(_ledger(tmp_path), iterations * 8 * 8)
    (written,) = (tmp_path / "traces" / "default").glob("digits-*.jsonl")
    trace = read_trace(written)  # the run's trace, replayable
    assert len(trace.trajectories) == iterations * 8 * 8 and trace.steps and trace.actions
    assert trace.summary is not None and trace.summary.throughput_tok_s > 0
    assert {"Tracing"} <= {e["reason"] for e in events}


def test_an_operator_restarted_mid_run_rebuilds_and_finishes_it(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The operator goes mid-run (its control loop with it) and a new one starts: it
    rebuilds the loop from the workers' and the trainer's state, no trajectory is ever
    resident on two workers, and every admitted sample is consumed once."""
    docs = _docs(iterations=6)
    with node_only(tmp_path, tiny_model) as (url, node), watching(url) as watcher:
        with operator_thread(url, _reconciler(node, tmp_path / "traces")):
            call(url, "POST", f"{NS}/rolloutpools", docs["RolloutPool"])
            call(url, "POST", f"{NS}/trainingruns", docs["TrainingRun"])
            eventually(
                lambda: _run(url).get("policyVersion", 0) >= 2,
                timeout_s=240,
                what="the run at version 2",
            )
        with operator_thread(url, _reconciler(node, tmp_path / "traces")):
            _succeeded(
                url, node, tmp_path, timeout_s=300, what="the run Succeeded under the new operator"
            )
    assert watcher.errors == [] and watcher.polls > 20 and watcher.residents > 0
    assert watcher.doubles == []
    _ledger_is_whole(_ledger(tmp_path), 6 * 8 * 8)
    # Each operator's loop wrote a trace of its own; the second's ends with the run.
    names = sorted(p.name for p in (tmp_path / "traces" / "default").glob("digits-*.jsonl"))
    second, first = names  # digits-UID.1.jsonl sorts first
    assert second == first.replace(".jsonl", ".1.jsonl")
    assert read_trace(tmp_path / "traces" / "default" / second).summary is not None


def test_scale_in_mid_run_drains_the_pod_by_sigterm_and_loses_nothing(
    tmp_path: Path, tiny_model: Path
) -> None:
    """`/scale` down mid-run: the operator deletes the chosen pod, the node sends it
    SIGTERM, the worker drains (its parked samples move) and exits within its grace; the
    run finishes with every admitted sample consumed once, none ever on two workers."""
    docs = _docs(iterations=6)
    with on_node(tmp_path, tiny_model) as (url, node, _), watching(url) as watcher:
        call(url, "POST", f"{NS}/rolloutpools", docs["RolloutPool"])
        call(url, "POST", f"{NS}/trainingruns", docs["TrainingRun"])
        eventually(
            lambda: _run(url).get("policyVersion", 0) >= 2,
            timeout_s=240,
            what="the run at version 2",
        )
        call(url, "PATCH", f"{NS}/rolloutgroups/mixed-a910x/scale", {"spec": {"replicas": 1}})
        (gone,) = eventually(
            lambda: list(node.ended), timeout_s=120, what="a scaled-in pod's process ended"
        )
        (scaled_in,) = eventually(
            lambda: _events(url, "ScaledIn"), timeout_s=OPERATOR_S, what="a ScaledIn event"
        )
        _succeeded(url, node, tmp_path, timeout_s=300, what="the run Succeeded after the scale-in")
    assert gone.startswith("mixed-a910x-") and scaled_in["message"].startswith(f"pod {gone}")
    assert node.ended[gone] == ("exited", 0), node.log(gone)[-1500:]
    assert watcher.errors == [] and watcher.polls > 20 and watcher.residents > 0
    assert watcher.doubles == []
    _ledger_is_whole(_ledger(tmp_path), 6 * 8 * 8)


def _autoscaled(budget: float) -> dict[str, dict[str, Any]]:
    """The example on small KV (about 3,000 tokens a worker) with long-tailed answers, one
    worker a group to start, and an autoscaler quick enough for a short run."""
    docs = _docs(iterations=4)
    pool = docs["RolloutPool"]["spec"]
    share = {"h800": 0.236, "a910x": 0.274}
    for g in pool["groups"]:
        g.update(replicas=1, maxReplicas=3)
        g["engine"].update(maxModelLen=1100, memoryUtilization=share[g["name"]])
    pool["autoscaling"] = {
        "enabled": True,
        "budgetPerHour": budget,
        "periodS": 2,
        "scaleUpStabilizationS": 2,
        "scaleDownStabilizationS": 6,
        "demandMemoryS": 4,
        "maxStep": 2,
    }
    lengths = {"law": "lognormal", "medianTokens": 80, "sigmaWithinGroup": 0.9}
    docs["TrainingRun"]["spec"]["batch"].update(maxTokens=1024, responseLengths=lengths)
    return docs


def test_the_autoscaler_grows_a_pool_short_of_kv_and_lets_its_tail_go(
    tmp_path: Path, tiny_model: Path
) -> None:
    """Within its budget at every reading: the pool grows while fresh work waits for KV,
    lets workers go when little is left to decode, and loses no sample."""
    budget, prices = 7.0, {"h800": 2.0, "a910x": 1.2}
    docs = _autoscaled(budget)
    costs: list[float] = []

    def cost_then(reason: str) -> list[dict[str, Any]]:
        pods = call(url, "GET", PODS)["items"]
        groups = [p["metadata"]["labels"].get("cadence.dev/group") for p in pods]
        costs.append(sum(prices.get(g or "", 0.0) for g in groups))
        return _events(url, reason)

    with on_node(tmp_path, tiny_model) as (url, node, _):
        call(url, "POST", f"{NS}/rolloutpools", docs["RolloutPool"])
        call(url, "POST", f"{NS}/trainingruns", docs["TrainingRun"])
        (grew, *_) = eventually(
            lambda: cost_then("AutoscaledOut"), timeout_s=240, what="an AutoscaledOut event"
        )
        (shrank, *_) = eventually(
            lambda: cost_then("AutoscaledIn"), timeout_s=300, what="an AutoscaledIn event"
        )
        _succeeded(url, node, tmp_path, timeout_s=300, what="the autoscaled run Succeeded")
        status = _status(url, f"{NS}/rolloutpools/mixed")
    assert "fresh samples waiting" in grew["message"] or "wait for" in grew["message"]
    assert "no fresh work waits" in shrank["message"]
    assert max(costs) <= budget, costs
    assert status["autoscaling"]["budgetPerHour"] == budget
    _ledger_is_whole(_ledger(tmp_path), 4 * 8 * 8)


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
    with on_node(tmp_path, model) as (url, node, _):
        call(url, "POST", f"{NS}/rolloutpools", docs["RolloutPool"])
        call(url, "POST", f"{NS}/trainingruns", docs["TrainingRun"])
        yield url, node
