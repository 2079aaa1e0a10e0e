"""`cadence dev cluster` as a person uses it: started, pointed at with kubectl, given the
example pool and run, which the operator reconciles and the node runs to the end; stopped,
nothing of it left running."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cadence.devcluster.cluster import DevCluster, node_available
from cadence.devcluster.emulator import call
from tests.helpers import ROOT, eventually

EXAMPLE = ROOT / "manifests" / "examples" / "dev-cluster.yaml"
NS = "/apis/cadence.dev/v1alpha1/namespaces/default"
PODS = "/api/v1/namespaces/default/pods"


@contextlib.contextmanager
def running(cluster: DevCluster) -> Iterator[tuple[str, list[str]]]:
    """The cluster served from a thread until the block ends; yields its URL and what it
    said."""
    said: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            cluster.run(say=said.append, stop_flag=stop)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        eventually(lambda: any("operator watching" in s for s in said), timeout_s=30, what="start")
        config = json.loads(cluster.kubeconfig.read_text())
        yield config["clusters"][0]["cluster"]["server"], said
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not thread.is_alive() and errors == []


def _kubectl(cluster: DevCluster, *args: str) -> str:
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _pods_processes() -> set[str]:
    """The pids of `cadence worker` and `cadence trainer` processes on this machine (as
    the node starts them: `python -c "...entry()" worker ...`)."""
    found = subprocess.run(
        ["pgrep", "-f", r"entry\(\) (worker|trainer) "], capture_output=True, text=True, check=False
    )
    return set(found.stdout.split())


def _phase(url: str) -> Any:
    return (call(url, "GET", f"{NS}/trainingruns/digits").get("status") or {}).get("phase")


@pytest.mark.kubectl
def test_without_a_node_the_operator_reconciles_what_kubectl_applies(tmp_path: Path) -> None:
    cluster = DevCluster(workdir=tmp_path, node=False, resync_s=0.5)
    with running(cluster) as (url, said):
        assert f"export KUBECONFIG={cluster.kubeconfig}" in "\n".join(said)
        _kubectl(cluster, "apply", "-f", str(EXAMPLE))
        eventually(
            lambda: len(call(url, "GET", PODS)["items"]) == 3,
            timeout_s=60,
            what="the pool's three worker pods written",
        )
        out = _kubectl(cluster, "get", "rolloutgroups")
        assert "mixed-h800" in out and "mixed-a910x" in out


@pytest.mark.slow
@pytest.mark.kubectl
@pytest.mark.timeout(600)
@pytest.mark.skipif(not node_available(), reason="the node needs root, iproute2 and unshare")
def test_the_example_run_trains_to_its_end_and_stopping_leaves_nothing(
    tmp_path: Path, tiny_model: Path
) -> None:
    cluster = DevCluster(workdir=tmp_path, claims={"models": tiny_model}, resync_s=0.5)
    before = _pods_processes()
    with running(cluster) as (url, _):
        _kubectl(cluster, "apply", "-f", str(EXAMPLE))
        eventually(
            lambda: len(_pods_processes() - before) == 4,
            timeout_s=120,
            what="the trainer and three workers running as processes",
        )
        eventually(lambda: _phase(url) == "Succeeded", timeout_s=300, what="the run's end")
        run = call(url, "GET", f"{NS}/trainingruns/digits")["status"]
        assert run["policyVersion"] == 10
        # A finished run's trainer stops (its StatefulSet to 0) and the pool's workers go.
        eventually(
            lambda: call(url, "GET", PODS)["items"] == [],
            timeout_s=120,
            what="no pod left after the run",
        )
    assert _pods_processes() - before == set(), "a pod's process outlived the cluster"
