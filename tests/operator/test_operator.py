"""The operator (kopf, `operator/handlers.py`) against the test Kubernetes emulator: a
pool gets its RolloutGroups, a run binds it and gets its trainer, each group gets worker
pods with the labels, devices and owner a cluster needs, `/scale` on a group moves its
pods, an invalid pool is Degraded with the field and an Event while others go on, and a
second run on a busy pool waits saying why. `kubectl get` shows the printer columns."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from cadence.operator import children
from cadence.operator.handlers import Reconciler
from cadence.operator.kube import Kube
from cadence.operator.localpool import CADENCE, free_port, wait_healthy, worker_processes
from cadence.operator.resources import TrainingRun
from cadence.operator.serve import operator_registry
from cadence.worker.tinymodel import make_tiny_llama

from .k8s_emulator import ApiError, KubernetesEmulator, call, serve, write_kubeconfig

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "trainingrun.yaml"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NS = "/apis/cadence.dev/v1alpha1/namespaces/default"
PODS = "/api/v1/namespaces/default/pods"


def _example(kind: str) -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] == kind)


def _eventually(probe: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := probe()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s")
        time.sleep(0.1)
    return result


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


@contextlib.contextmanager
def operator_on(
    make: Callable[[Kube], Reconciler] = Reconciler,
) -> Iterator[str]:
    """The emulator with the CRDs, and the operator running against it in a thread of
    its own (kopf cancels every task of its loop when it stops)."""
    with serve(KubernetesEmulator()) as url:
        for path in sorted((ROOT / "crds").glob("*.cadence.dev.yaml")):
            call(url, "POST", CRDS, yaml.safe_load(path.read_text()))
        stop = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            async def main() -> None:
                kube = Kube(url)
                try:
                    await kopf.operator(
                        registry=operator_registry(kube, url, make(kube)),
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
            yield url
        finally:
            stop.set()
            thread.join(timeout=20)
        assert not thread.is_alive() and errors == []


@pytest.fixture
def cluster() -> Iterator[str]:
    with operator_on() as url:
        yield url


def test_a_pool_and_a_run_get_groups_pods_and_a_trainer(cluster: str) -> None:
    pool = call(cluster, "POST", f"{NS}/rolloutpools", _example("RolloutPool"))
    _eventually(lambda: len(call(cluster, "GET", f"{NS}/rolloutgroups")["items"]) == 2)
    groups = call(cluster, "GET", f"{NS}/rolloutgroups")["items"]
    assert sorted(g["metadata"]["name"] for g in groups) == ["mixed-a910x", "mixed-h800"]
    for g in groups:
        assert g["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]
    assert _pods(cluster) == []  # no run bound: a worker needs the run's model
    run = call(cluster, "POST", f"{NS}/trainingruns", _example("TrainingRun"))
    _eventually(lambda: len(_pods(cluster)) == 4)
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
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "1"}
    for kind, path in (
        ("StatefulSet", "/apis/apps/v1/namespaces/default/statefulsets/digits-trainer"),
        ("Service", "/api/v1/namespaces/default/services/digits-trainer"),
        ("ConfigMap", "/api/v1/namespaces/default/configmaps/digits-trainer"),
    ):
        obj = call(cluster, "GET", path)
        assert obj["kind"] == kind
        assert obj["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
    status = _eventually(lambda: call(cluster, "GET", f"{NS}/trainingruns/digits").get("status"))
    assert status["phase"] == "Running"
    group = _eventually(
        lambda: (call(cluster, "GET", f"{NS}/rolloutgroups/mixed-h800").get("status") or {}).get(
            "selector"
        )
    )
    assert group == "cadence.dev/pool=mixed,cadence.dev/group=h800"


def test_scale_on_a_group_moves_its_pods(cluster: str) -> None:
    call(cluster, "POST", f"{NS}/rolloutpools", _example("RolloutPool"))
    call(cluster, "POST", f"{NS}/trainingruns", _example("TrainingRun"))
    _eventually(lambda: len(_pods(cluster, "a910x")) == 2)
    scale = f"{NS}/rolloutgroups/mixed-a910x/scale"
    call(cluster, "PATCH", scale, {"spec": {"replicas": 3}})
    _eventually(lambda: len(_pods(cluster, "a910x")) == 3)
    assert call(cluster, "GET", scale)["spec"]["replicas"] == 3
    call(cluster, "PATCH", scale, {"spec": {"replicas": 1}})
    _eventually(lambda: len(_pods(cluster, "a910x")) == 1)
    assert len(_pods(cluster, "h800")) == 2  # the other group is its own
    # The pool's replicas were only the initial value: re-applying it changes nothing.
    pool = call(cluster, "GET", f"{NS}/rolloutpools/mixed")
    call(cluster, "PATCH", f"{NS}/rolloutpools/mixed", {"metadata": {"labels": {"touched": "1"}}})
    time.sleep(1.0)
    assert len(_pods(cluster, "a910x")) == 1 and pool["spec"]["groups"][1]["replicas"] == 2


def test_an_invalid_pool_is_degraded_with_an_event_and_others_go_on(cluster: str) -> None:
    bad = _example("RolloutPool")
    bad["metadata"]["name"] = "broken"
    bad["spec"]["groups"][0]["accelerator"] = "TPU-v9"
    call(cluster, "POST", f"{NS}/rolloutpools", bad)
    call(cluster, "POST", f"{NS}/rolloutpools", _example("RolloutPool"))
    conditions = _eventually(
        lambda: (call(cluster, "GET", f"{NS}/rolloutpools/broken").get("status") or {}).get(
            "conditions"
        )
    )
    degraded = next(c for c in conditions if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "Invalid"
    assert degraded["message"].startswith("spec.groups.0: unknown accelerator 'TPU-v9'")
    events = _eventually(
        lambda: [
            e
            for e in call(cluster, "GET", "/api/v1/namespaces/default/events")["items"]
            if e.get("reason") == "Invalid"
        ]
    )
    assert events[0]["involvedObject"]["name"] == "broken" and events[0]["type"] == "Warning"
    groups = _eventually(lambda: call(cluster, "GET", f"{NS}/rolloutgroups")["items"])
    assert {g["spec"]["pool"] for g in groups} == {"mixed"}  # the valid pool went on


def test_a_second_run_on_a_busy_pool_waits_saying_why(cluster: str) -> None:
    call(cluster, "POST", f"{NS}/rolloutpools", _example("RolloutPool"))
    call(cluster, "POST", f"{NS}/trainingruns", _example("TrainingRun"))
    _eventually(
        lambda: (
            (call(cluster, "GET", f"{NS}/trainingruns/digits").get("status") or {}).get("phase")
            == "Running"
        )
    )
    second = _example("TrainingRun")
    second["metadata"]["name"] = "digits-2"
    call(cluster, "POST", f"{NS}/trainingruns", second)
    status = _eventually(lambda: call(cluster, "GET", f"{NS}/trainingruns/digits-2").get("status"))
    assert status["phase"] == "Waiting"
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] == "PoolBusy" and "serves TrainingRun digits" in ready["message"]


def test_kubectl_shows_the_columns(cluster: str, tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", cluster)
    kubectl = ["kubectl", "--kubeconfig", str(config)]
    subprocess.run(
        [*kubectl, "apply", "--validate=false", "-f", str(EXAMPLE)], check=True, capture_output=True
    )
    _eventually(
        lambda: (call(cluster, "GET", f"{NS}/trainingruns/digits").get("status") or {}).get("phase")
    )
    _eventually(
        lambda: (call(cluster, "GET", f"{NS}/rolloutpools/mixed").get("status") or {}).get("ready")
    )
    out = subprocess.run(
        [*kubectl, "get", "rolloutpools,rolloutgroups,trainingruns"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    print(out)  # the README quotes it
    lines = [line.split() for line in out.splitlines() if line.strip()]
    assert lines[0] == ["NAME", "READY", "WORKERS", "RUN", "VERSIONS", "TOK/S", "AGE"]
    assert lines[1][0] == "rolloutpool.cadence.dev/mixed"
    assert ["NAME", "POOL", "PHASE", "VERSION", "TOK/S", "P95", "AGE"] in lines
    run_row = next(line for line in lines if line[0] == "trainingrun.cadence.dev/digits")
    assert run_row[1:3] == ["mixed", "Running"]


def test_the_operator_runs_the_control_loop_on_the_pools_pods(tmp_path: Path) -> None:
    """End to end: pod endpoints point at emulated workers on this machine (one host
    process whose workers are named as the operator names its pods), the run's trainer
    endpoint at a trainer process; the run trains to its last version."""
    endpoints: dict[str, str] = {}
    trainer: dict[str, str] = {}

    def reconciler(kube: Kube) -> Reconciler:
        return Reconciler(
            kube,
            endpoint=lambda pod: endpoints.get(pod["metadata"]["name"]),
            trainer_endpoint=lambda _: trainer["url"],
            status_every_s=0.5,
        )

    text = EXAMPLE.read_text().replace("iterations: 30", "iterations: 3")
    docs = {d["kind"]: d for d in yaml.safe_load_all(text) if d}
    with operator_on(reconciler) as url:
        call(url, "POST", f"{NS}/rolloutpools", docs["RolloutPool"])
        secret = _eventually(lambda: _get(url, "/api/v1/namespaces/default/secrets/cadence-token"))
        token = base64.b64decode(secret["data"]["token"]).decode()
        model = make_tiny_llama(tmp_path / "model")
        config = children.trainer_config(TrainingRun.model_validate(docs["TrainingRun"]))
        config = config.model_copy(update={"model_path": model, "state_dir": tmp_path / "state"})
        (tmp_path / "trainer.json").write_text(config.model_dump_json())
        port = free_port()
        env = {**os.environ, "CADENCE_TOKEN": token}
        log = (tmp_path / "trainer.log").open("wb")
        trainer_process = subprocess.Popen(
            [*CADENCE, "trainer", "--config", str(tmp_path / "trainer.json"), "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        pods = [("mixed-h800-0", "H800", 2), ("mixed-h800-1", "H800", 2)]
        pods += [("mixed-a910x-0", "A910X", 1), ("mixed-a910x-1", "A910X", 1)]
        hosted = [a for p in pods for a in ("--hosted", ":".join(map(str, p)))]
        args = [*hosted, "--model-path", str(model), "--weights-dir", str(tmp_path / "w")]
        try:
            trainer["url"] = f"http://127.0.0.1:{port}"
            wait_healthy([trainer["url"]], [trainer_process], within_s=120)
            with worker_processes(
                ["host"],
                lambda _: [*args, "--trainer-url", trainer["url"]],
                env={"CADENCE_TOKEN": token},
                within_s=120,
            ) as hosts:
                endpoints.update({name: f"{hosts['host']}/{name}" for name, _, _ in pods})
                call(url, "POST", f"{NS}/trainingruns", docs["TrainingRun"])
                status = _eventually(
                    lambda: (
                        _status(url, f"{NS}/trainingruns/digits").get("phase") == "Succeeded"
                        and _status(url, f"{NS}/trainingruns/digits")
                    ),
                    timeout=120,
                )
        finally:
            trainer_process.terminate()
            trainer_process.wait(timeout=30)
    assert status["policyVersion"] == 3 and status["step"] == 3
    assert status["tokensPerSecond"] > 0 and 0 < status["latencyP50S"] <= status["latencyP95S"]
    assert status["tokensPerDollar"] > 0
    db = sqlite3.connect(tmp_path / "state" / "ledger.db")
    states = dict(db.execute("SELECT state, COUNT(*) FROM samples GROUP BY state").fetchall())
    assert states == {"consumed": 3 * 8 * 8}  # every admitted sample ended, once


def _get(url: str, path: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = call(url, "GET", path)
    except ApiError:
        return None
    return found
