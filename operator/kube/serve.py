"""`cadence operator`: the kopf operator as its Deployment runs it. In a pod it logs in
with the pod's service account; `--server URL` points it at another API server (a local
emulator, a proxied cluster). Liveness is kopf's own endpoint; metrics (`metrics.py`: each
group's waiting demand, each run's loop) are served by prometheus-client on
`--metrics-port`."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
from prometheus_client import REGISTRY, start_http_server

from cadence.operator.kube.client import Kube
from cadence.operator.kube.handlers import Reconciler, register


def operator_registry(
    kube: Kube,
    server: str | None,
    reconciler: Reconciler | None = None,
    *,
    resync_s: float = 5.0,
) -> kopf.OperatorRegistry:
    """The operator's handlers on a fresh registry; `reconciler` replaces the default
    one (tests give workers' and the trainer's endpoints on this machine). Every object
    is reconciled again each `resync_s` seconds."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if server is not None:
            return kopf.ConnectionInfo(server=server, insecure=True)
        return kopf.login_with_service_account(**kwargs)

    register(registry, reconciler or Reconciler(kube), resync_s=resync_s)
    return registry


def serve(
    *,
    namespaces: list[str],
    server: str | None,
    metrics_port: int,
    health_port: int,
    resync_s: float = 5.0,
) -> None:
    async def main() -> None:
        kube = Kube(server) if server is not None else Kube.in_cluster()
        reconciler = Reconciler(kube)
        REGISTRY.register(reconciler.metrics)
        try:
            await kopf.operator(
                registry=operator_registry(kube, server, reconciler, resync_s=resync_s),
                standalone=True,
                clusterwide=not namespaces,
                namespaces=namespaces,
                liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz",
            )
        finally:
            await kube.aclose()

    start_http_server(metrics_port)
    asyncio.run(main())
