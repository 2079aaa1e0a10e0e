"""`cadence operator`: the kopf operator as its Deployment runs it. In a pod it logs in
with the pod's service account; `--server URL` points it at another API server (a local
emulator, a proxied cluster). With `--leader-elect`, replicas elect one leader through a
Lease (`leader.py`) and only it runs kopf; the others stand by. `/healthz` on the health
port answers for both (a standby is healthy); metrics (`metrics.py`: each group's waiting
demand, each run's loop) are served by prometheus-client on `--metrics-port`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
from aiohttp import web
from prometheus_client import REGISTRY, start_http_server

from cadence.operator.kube.client import SERVICE_ACCOUNT, Kube
from cadence.operator.kube.credentials import connection
from cadence.operator.kube.handlers import Reconciler, register
from cadence.operator.kube.leader import LeaderElector

log = logging.getLogger("cadence.operator")

StopFlag = asyncio.Event | threading.Event


def operator_registry(
    kube: Kube,
    server: str | kopf.ConnectionInfo | None,
    reconciler: Reconciler | None = None,
    *,
    resync_s: float = 5.0,
    namespaced: bool = True,
    kubeconfig: Path | None = None,
    context: str | None = None,
) -> kopf.OperatorRegistry:
    """The operator's handlers on a fresh registry; `reconciler` replaces the default
    one (tests give workers' and the trainer's endpoints on this machine). Every object
    is reconciled again each `resync_s` seconds. A `namespaced` operator (given its
    namespaces) asks nothing of the cluster as a whole: kopf's scanning of namespaces
    and CRDs is off, so a Role in each namespace is all it needs."""
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.scanning.disabled = namespaced

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # The credentials the operator's own client has, read again (an exec plugin's
        # token expires; kopf logs in again when the API server refuses it).
        if isinstance(server, kopf.ConnectionInfo):
            return connection(kubeconfig=kubeconfig, context=context)
        return connection(server=server)

    register(registry, reconciler or Reconciler(kube), resync_s=resync_s)
    return registry


def own_namespace() -> str:
    """Where the Lease lives: the pod's namespace, else `default` (outside a cluster)."""
    found = SERVICE_ACCOUNT / "namespace"
    return found.read_text().strip() if found.is_file() else "default"


@dataclass
class Health:
    """`/healthz`: 200 while this process is a standby or its kopf operator runs."""

    operator: asyncio.Task[None] | None = None

    async def healthz(self, _: web.Request) -> web.Response:
        if self.operator is not None and self.operator.done():
            return web.Response(status=503, text="the operator stopped\n")
        return web.Response(text="leading\n" if self.operator else "standby\n")

    @contextlib.asynccontextmanager
    async def served(self, port: int | None) -> Any:
        if port is None:
            yield self
            return
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "0.0.0.0", port).start()
        try:
            yield self
        finally:
            await runner.cleanup()


async def operate(
    kube: Kube,
    *,
    server: str | kopf.ConnectionInfo | None,
    namespaces: list[str],
    reconciler: Reconciler | None = None,
    resync_s: float = 5.0,
    elector: LeaderElector | None = None,
    stop_flag: StopFlag | None = None,
    health_port: int | None = None,
    kubeconfig: Path | None = None,
    context: str | None = None,
) -> bool:
    """Runs the operator until `stop_flag` (or a signal); with `elector`, only once it
    leads, and only while it does. Returns False when leadership was lost (the caller
    exits non-zero, and its restart is a candidate again)."""
    reconciler = reconciler or Reconciler(kube)
    health = Health()
    async with health.served(health_port):
        if elector is not None:
            waiting = asyncio.ensure_future(elector.acquire())
            stopped = asyncio.ensure_future(_stopped(stop_flag))
            await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                waiting.cancel()
                stopped.cancel()
                return True  # stopped while standing by
            stopped.cancel()
        inner = asyncio.Event()
        operator = asyncio.ensure_future(
            kopf.operator(
                registry=operator_registry(
                    kube,
                    server,
                    reconciler,
                    resync_s=resync_s,
                    namespaced=bool(namespaces),
                    kubeconfig=kubeconfig,
                    context=context,
                ),
                standalone=True,
                clusterwide=not namespaces,
                namespaces=namespaces,
                stop_flag=inner,
            )
        )
        health.operator = operator
        watchers = {asyncio.ensure_future(_stopped(stop_flag))}
        if elector is not None:
            watchers.add(asyncio.ensure_future(elector.hold()))
        await asyncio.wait({operator, *watchers}, return_when=asyncio.FIRST_COMPLETED)
        lost = elector is not None and not elector.leading
        inner.set()
        for w in watchers:
            w.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await operator
        if elector is not None:
            await elector.release()
        return not lost


async def _stopped(flag: StopFlag | None) -> None:
    if flag is None:
        await asyncio.Event().wait()  # until cancelled
    elif isinstance(flag, asyncio.Event):
        await flag.wait()
    else:
        while not flag.is_set():
            await asyncio.sleep(0.1)


def configure_logging(log_format: str = "full", *, verbose: bool = False) -> None:
    """Log as `kopf run` does: INFO and above (DEBUG when verbose), each line with its
    time, logger and level, or as JSON for a log pipeline. Without it an operator
    embedding kopf logs nothing below WARNING and no time at all. Logging that the
    process has already set up is left as it is."""
    if logging.getLogger().handlers:
        return  # a program running the operator in process (a test suite) logs its way
    formats = {"full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}
    kopf.configure(verbose=verbose, log_format=formats[log_format])


def serve(
    *,
    namespaces: list[str],
    server: str | None,
    metrics_port: int,
    health_port: int,
    resync_s: float = 5.0,
    leader_elect: bool = False,
    lease_namespace: str | None = None,
    scrapers_namespace: str = "monitoring",
    kubeconfig: Path | None = None,
    context: str | None = None,
    trace_dir: Path | None = None,
) -> bool:
    info = connection(server=server, kubeconfig=kubeconfig, context=context)

    async def main() -> bool:
        kube = Kube.connect(info)
        reconciler = Reconciler(
            kube,
            operator_namespace=own_namespace(),
            scrapers_namespace=scrapers_namespace,
            trace_dir=trace_dir,
        )
        REGISTRY.register(reconciler.metrics)
        elector = LeaderElector(kube, lease_namespace or own_namespace()) if leader_elect else None
        try:
            return await operate(
                kube,
                server=server if server is not None else info,
                namespaces=namespaces,
                reconciler=reconciler,
                resync_s=resync_s,
                elector=elector,
                health_port=health_port,
                kubeconfig=kubeconfig,
                context=context,
            )
        finally:
            await kube.aclose()

    start_http_server(metrics_port)
    return asyncio.run(main())
