"""`cadence dev cluster`: the emulator, the kubelet stand-in and the operator in one
process, so that anyone can apply a pool and a run with `kubectl` and watch the operator
reconcile them, with no cluster at hand.

The emulator serves the API on 127.0.0.1 with Cadence's CRDs installed and writes a
kubeconfig for it; the node (where root and iproute2 allow) runs every pod as a process in
its own network namespace; the operator watches the given namespaces. The three stop
together on Ctrl-C or SIGTERM, the node ending its pods first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from cadence.devcluster.emulator import KubernetesEmulator, call, serve, write_kubeconfig
from cadence.devcluster.kubelet import Kubelet, available
from cadence.operator.kube import crds
from cadence.operator.kube.client import Kube
from cadence.operator.kube.handlers import Reconciler
from cadence.operator.kube.serve import StopFlag, operate

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@dataclass
class DevCluster:
    """What `cadence dev cluster` starts, and where it keeps its files."""

    workdir: Path
    port: int = 0  # the API server's port on 127.0.0.1 (0: a free one)
    namespaces: list[str] = field(default_factory=lambda: ["default"])
    node: bool = True  # run pods (needs root and iproute2); without it pods stay Pending
    claims: dict[str, Path] = field(default_factory=dict)  # claim name -> host folder
    resync_s: float = 5.0

    @contextlib.contextmanager
    def api(self) -> Iterator[str]:
        """The emulator with the CRDs applied and a kubeconfig written; yields its URL."""
        with serve(KubernetesEmulator(), port=self.port) as url:
            for text in crds.rendered().values():
                for doc in yaml.safe_load_all(text):
                    if doc:
                        call(url, "POST", CRDS, doc)
            for namespace in self.namespaces:
                if namespace != "default":
                    body = {
                        "apiVersion": "v1",
                        "kind": "Namespace",
                        "metadata": {"name": namespace},
                    }
                    call(url, "POST", "/api/v1/namespaces", body)
            write_kubeconfig(self.kubeconfig, url, self.namespaces[0])
            yield url

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def run(self, say: Callable[[str], None], stop_flag: StopFlag | None = None) -> None:
        """Serve until `stop_flag` is set or a signal stops the operator."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        for chatty in ("aiohttp.access", "httpx"):  # a line per request, probes included
            logging.getLogger(chatty).setLevel(logging.WARNING)
        with self.api() as url, contextlib.ExitStack() as stack:
            node = None
            if self.node:
                node = stack.enter_context(Kubelet(url, self.workdir / "node", claims=self.claims))
            say(f"API server {url}; kubeconfig {self.kubeconfig}")
            say(f"  export KUBECONFIG={self.kubeconfig}")
            if node is None:
                say("  no node: pods are written but stay Pending")
            else:
                say(f"  pods run here as processes; their logs in {self.workdir / 'node' / 'logs'}")
            say(f"operator watching {', '.join(self.namespaces)}; Ctrl-C stops everything")
            asyncio.run(self._operate(url, node, stop_flag))

    async def _operate(self, url: str, node: Kubelet | None, stop_flag: StopFlag | None) -> None:
        kube = Kube(url)
        try:
            reconciler = Reconciler(kube, transport=node.transport() if node else None)
            await operate(
                kube,
                server=url,
                namespaces=self.namespaces,
                reconciler=reconciler,
                resync_s=self.resync_s,
                stop_flag=stop_flag,
            )
        finally:
            await kube.aclose()


def node_available() -> bool:
    """Whether this machine can run the node (root, iproute2, unshare)."""
    return available()
