"""Operator load bench: what the real operator (kopf, the production registry and resync)
asks of the Kubernetes API server to run a pool of N worker pods, and whether it
converges. Run: `cadence bench operator --pods N --groups G`.

Why: the operator's cost to a cluster is its API requests, not its CPU. A reconcile that
reads each pod by name, or a resync that grows with the pods, or status written on
every change, is a request storm at 1,000 pods that no test of 4 pods shows. The target:
at 1,024 pods the pool converges, a steady resync costs O(groups) requests, not O(pods)
(pods are listed, never read one by one), and status patches do not storm.

How: the Kubernetes emulator (kmock's, `cadence.devcluster.emulator`, given by the
caller: a bench may not import the devcluster) is served in the bench's event loop
behind a handler that records every request (method, path, User-Agent) before the
emulator answers it; the operator runs in the same loop, as in the operator's tests,
on fake time (looptime): the resync period and kopf's batching windows take no wall
time, and what the operator measures in seconds it measures on that clock. The bench:

1. creates a RolloutPool of G groups (N pods in all) and a TrainingRun that binds it;
   a kubelet stand-in marks every worker pod Ready (below); until every pod is Ready and
   the pool's status says N/N (`converge`);
2. nothing changes for `STEADY_RESYNCS` resync periods (`steady`; `requests_per_resync`
   is its requests over the periods, counted from half-way between two resyncs, after
   one period to settle);
3. every group's `spec.replicas` up by a tenth (`scale_out`), then back (`scale_in`),
   each until the pool's status says so.

The kubelet stand-in (the cheapest honest one): `devcluster/kubelet.py` runs every pod
as a process, which 1,024 pods on one machine cannot do. Here, at most once a second (the
stand-in's probe period), after a write, the bench lists the pods and patches each new
worker pod's `/status` with what that stand-in writes for a running pod whose readiness
probe passed (phase Running, a podIP, the Ready condition, its container ready). Pods
are not bound to a node, so the emulator deletes them at once (no graceful termination).
No worker or trainer answers: the operator's HTTP clients to them get a refused
connection at once (`Reconciler.transport`), so nothing waits on the network.

Counted: the operator's requests (its own client's and kopf's; the stand-in's and the
bench's are apart, `bench_requests`), by verb (get, list, watch, create, patch, update,
delete) and by resource (`pods`, `rolloutgroups/status`, ...). `get_per_pod` is the
GETs of single worker pods. Times: `*_s` on the fake clock (resync periods and waits,
what the operator itself sees), `*_wall_s` in wall seconds (this process's CPU: the
emulator, the operator and the stand-in on one core)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import aiohttp.web
import httpx
import kopf
import looptime
import yaml

from cadence.operator.kube import crds
from cadence.operator.kube.client import Kube
from cadence.operator.kube.handlers import Reconciler
from cadence.operator.kube.serve import operator_registry

RESYNC_S = 5.0  # the operator's resync as shipped (`cadence operator --resync`)
STEADY_RESYNCS = 3  # resync periods counted with nothing changing
PROBE_S = 1.0  # how often the kubelet stand-in looks, as its readiness probes do
WAIT_S = 600.0  # fake seconds a phase may take before the bench gives up
BENCH_AGENT = "cadence-bench"  # the User-Agent of the bench's own requests
NS = "default"
API = f"/apis/cadence.dev/v1alpha1/namespaces/{NS}"
PODS = f"/api/v1/namespaces/{NS}/pods"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
POOL, RUN = "bench", "bench-run"
VERBS = ("get", "list", "watch", "create", "patch", "update", "delete")


class Emulator(Protocol):
    """What the bench needs of `cadence.devcluster.emulator.KubernetesEmulator`: an
    aiohttp handler, entered before it serves, that says when it stored a write."""

    async def __call__(self, raw: aiohttp.web.BaseRequest, /) -> aiohttp.web.StreamResponse: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any, /
    ) -> Any: ...

    async def written(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class Request:
    agent: str
    verb: str  # as RBAC names it; "discovery" for /api, /apis, /version
    resource: str  # plural, with its subresource: "pods", "rolloutgroups/status"
    name: str | None


def classify(method: str, path: str, query: dict[str, str], agent: str) -> Request:
    """One HTTP request to the API server, as RBAC reads it."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        rest = parts[3:]
    else:
        rest = []
    if not rest:
        return Request(agent, "discovery", "", None)
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    name = rest[1] if len(rest) > 1 else None
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method)
    if verb is None:
        watching = query.get("watch") in {"true", "1"}
        verb = "watch" if watching else ("get" if name else "list")
    if verb == "delete" and name is None:
        verb = "deletecollection"
    return Request(agent, verb, resource, name)


@dataclasses.dataclass
class Recorder:
    """Every request the emulator serves, recorded before it answers."""

    emulator: Emulator
    requests: list[Request] = dataclasses.field(default_factory=list)

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        agent = raw.headers.get("User-Agent", "")
        self.requests.append(classify(raw.method, raw.path, dict(raw.query), agent))
        return await self.emulator(raw)


@dataclasses.dataclass
class Phase:
    """The operator's requests from one mark of the record to the next."""

    name: str
    requests: list[Request]
    workers: set[str]  # every worker pod's name the stand-in saw

    def operator(self) -> list[Request]:
        return [r for r in self.requests if r.agent != BENCH_AGENT and r.verb != "discovery"]

    def report(self) -> dict[str, Any]:
        ours = self.operator()
        by_resource: dict[str, dict[str, int]] = {}
        for (verb, resource), n in sorted(Counter((r.verb, r.resource) for r in ours).items()):
            by_resource.setdefault(resource, {})[verb] = n
        return {
            "requests": len(ours),
            "by_verb": _by_verb(ours),
            "by_resource": by_resource,
            "status_patches": sum(
                r.verb == "patch" and r.resource.endswith("/status") for r in ours
            ),
            "get_per_pod": self.get_per_pod(),
            "bench_requests": len(self.requests) - len(ours),
        }

    def get_per_pod(self) -> int:
        return sum(
            r.verb == "get" and r.resource == "pods" and r.name in self.workers
            for r in self.operator()
        )


def _by_verb(requests: list[Request]) -> dict[str, int]:
    counted = Counter(r.verb for r in requests)
    return {verb: counted[verb] for verb in (*VERBS, *sorted(set(counted) - set(VERBS)))}


def pool_and_run(pods: int, groups: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A RolloutPool of `groups` groups of `pods` workers in all (the first groups one
    more where it does not divide), room for a tenth more in each; a run that binds it."""
    sizes = [pods // groups + (i < pods % groups) for i in range(groups)]
    pool = {
        "apiVersion": "cadence.dev/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": POOL, "namespace": NS},
        "spec": {
            "groups": [
                {
                    "name": f"g{i}",
                    "accelerator": "H800",
                    "affinity": i % 3,
                    "replicas": size,
                    "maxReplicas": max(64, largest_group(size, 1)),
                    "resources": {"nvidia.com/gpu": "1"},
                }
                for i, size in enumerate(sizes)
            ]
        },
    }
    run = {
        "apiVersion": "cadence.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": RUN, "namespace": NS},
        "spec": {
            "pool": POOL,
            "model": {"catalog": "Qwen3-8B"},
            "dataset": {"task": "digits"},
            "batch": {"promptsPerBatch": 8, "samplesPerPrompt": 8, "maxTokens": 12},
        },
    }
    return pool, run


def _tenth(n: int) -> int:
    return math.ceil(n / 10)


def largest_group(pods: int, groups: int) -> int:
    """The most replicas a group reaches in the bench (its share, scaled out)."""
    size = math.ceil(pods / groups)
    return size + _tenth(size)


def _refused(request: httpx.Request) -> httpx.Response:
    """No worker and no trainer runs here: every connection to one is refused."""
    raise httpx.ConnectError("nothing runs behind the pods in this bench", request=request)


@dataclasses.dataclass
class Bench:
    pods: int
    groups: int
    emulator: Emulator
    url: str = ""
    http: httpx.AsyncClient | None = None
    recorder: Recorder | None = None
    workers: set[str] = dataclasses.field(default_factory=set)
    ready: set[str] = dataclasses.field(default_factory=set)  # uids of pods marked Ready
    mark: int = 0  # where the current phase starts in the record
    phases: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        assert self.http is not None
        content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
        answer = await self.http.request(
            method,
            self.url + path,
            content=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": content_type, "User-Agent": BENCH_AGENT},
        )
        answer.raise_for_status()
        return answer.json()

    def close(self, name: str) -> dict[str, Any]:
        """The phase `name`'s report: the requests since the last phase closed."""
        assert self.recorder is not None
        phase = Phase(name, self.recorder.requests[self.mark :], self.workers)
        self.mark = len(self.recorder.requests)
        self.phases[name] = phase.report()
        return self.phases[name]

    @contextlib.asynccontextmanager
    async def served(self) -> AsyncIterator[None]:
        self.recorder = Recorder(self.emulator)
        async with self.emulator, httpx.AsyncClient(timeout=60.0) as self.http:
            server = aiohttp.web.Server(self.recorder, handler_cancellation=True)
            runner = aiohttp.web.ServerRunner(server, shutdown_timeout=0.5)
            await runner.setup()
            try:
                site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                host, port = runner.addresses[0][:2]
                self.url = f"http://{host}:{port}"
                for text in crds.rendered().values():
                    for doc in yaml.safe_load_all(text):
                        if doc:
                            await self.call("POST", CRDS, doc)
                yield
            finally:
                await runner.cleanup()

    @contextlib.asynccontextmanager
    async def operating(self) -> AsyncIterator[Reconciler]:
        """The operator as `cadence operator --server URL` runs it (its registry, resync
        and namespace), its clients to workers and the trainer refused at once."""
        kube = Kube(self.url)
        reconciler = Reconciler(kube, transport=httpx.MockTransport(_refused))
        stop = asyncio.Event()
        running = asyncio.create_task(
            kopf.operator(
                registry=operator_registry(kube, self.url, reconciler, resync_s=RESYNC_S),
                standalone=True,
                namespaces=[NS],
                stop_flag=stop,
            )
        )
        try:
            yield reconciler
        finally:
            stop.set()
            await running
            await kube.aclose()

    async def kubelet(self) -> None:
        """The kubelet stand-in: after a write, at most once a second, each new worker
        pod's status as a running pod's whose readiness probe passed."""
        wrote = asyncio.ensure_future(self.emulator.written())
        try:
            while True:
                await wrote
                await asyncio.sleep(PROBE_S)
                # Waiting on the next write before it looks: a pod made while it looks
                # is seen on its next turn, not left until something else writes.
                wrote = asyncio.ensure_future(self.emulator.written())
                await asyncio.sleep(0)
                await self.mark_ready()
        finally:
            wrote.cancel()

    async def mark_ready(self) -> None:
        """One look of the stand-in: every worker pod not yet marked, marked Ready."""
        for pod in (await self.call("GET", PODS))["items"]:
            meta = pod["metadata"]
            if (meta.get("labels") or {}).get("app.kubernetes.io/component") != "worker":
                continue
            self.workers.add(meta["name"])
            if meta["uid"] in self.ready or meta.get("deletionTimestamp"):
                continue
            index = len(self.ready)
            status = {
                "phase": "Running",
                "podIP": f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}",
                "hostIP": "10.255.255.1",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": pod["spec"]["containers"][0]["name"],
                        "ready": True,
                        "restartCount": 0,
                        "state": {"running": {}},
                    }
                ],
            }
            await self.call("PATCH", f"{PODS}/{meta['name']}/status", {"status": status})
            self.ready.add(meta["uid"])

    async def until(self, check: Callable[[], Awaitable[bool]], what: str) -> None:
        """Until `check()`, tried after each write the emulator stores (or a second)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while not await check():
            if loop.time() >= deadline:
                raise RuntimeError(f"not within {WAIT_S:.0f} s (fake): {what}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.emulator.written(), timeout=PROBE_S)

    async def pool_says(self, pods: int) -> bool:
        """Whether the pool's status says `pods` workers, all of them Ready."""
        status = (await self.call("GET", f"{API}/rolloutpools/{POOL}")).get("status") or {}
        return status.get("ready") == f"{pods}/{pods}" and status.get("workers") == pods

    async def scale(self, replicas: dict[str, int]) -> int:
        """Each group's replicas set, as `kubectl scale` sets them; the new total."""
        for name, n in replicas.items():
            await self.call("PATCH", f"{API}/rolloutgroups/{name}", {"spec": {"replicas": n}})
        return sum(replicas.values())

    async def timed(self, name: str, act: Awaitable[int]) -> dict[str, float]:
        """`act` (it returns the pods the pool should have), then until they are all
        Ready and the pool says so; its fake and wall seconds. Closes the phase."""
        loop = asyncio.get_running_loop()
        t0, w0 = loop.time(), time.perf_counter()
        pods = await act

        async def done() -> bool:
            return await self.pool_says(pods)

        await self.until(done, f"{name}: {pods} pods Ready, said by the pool")
        took = {f"{name}_s": round(loop.time() - t0, 1)}
        took[f"{name}_wall_s"] = round(time.perf_counter() - w0, 1)
        self.close(name)
        return took

    async def run(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pods": self.pods, "groups": self.groups}
        pool, run = pool_and_run(self.pods, self.groups)
        sizes = {f"{POOL}-{g['name']}": g["replicas"] for g in pool["spec"]["groups"]}

        async def create() -> int:
            await self.call("POST", f"{API}/rolloutpools", pool)
            await self.call("POST", f"{API}/trainingruns", run)
            return self.pods

        async with self.served(), self.operating():
            kubelet = asyncio.create_task(self.kubelet())
            try:
                await asyncio.sleep(RESYNC_S)  # kopf starts: its first lists and watches
                self.close("startup")
                out |= await self.timed("converge", create())
                # A period for what the last change set going to settle, and half of one
                # more: the pool's status is written in a resync, so the counted periods
                # start and end half-way between two, never on one.
                await asyncio.sleep(1.5 * RESYNC_S)
                self.close("settle")
                await asyncio.sleep(STEADY_RESYNCS * RESYNC_S)
                steady = self.close("steady")
                out["requests_per_resync"] = round(steady["requests"] / STEADY_RESYNCS, 1)
                out["status_patches_per_resync"] = round(
                    steady["status_patches"] / STEADY_RESYNCS, 1
                )
                more = {name: n + _tenth(n) for name, n in sizes.items()}
                out |= await self.timed("scale_out", self.scale(more))
                out |= await self.timed("scale_in", self.scale(sizes))
            finally:
                kubelet.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await kubelet
        phases = self.phases.values()
        out["requests_total"] = sum(p["requests"] for p in phases)
        verbs = [*VERBS, *sorted({v for p in phases for v in p["by_verb"]} - set(VERBS))]
        out["requests_by_verb"] = {v: sum(p["by_verb"].get(v, 0) for p in phases) for v in verbs}
        out["get_per_pod"] = sum(p["get_per_pod"] for p in phases)
        out["status_patches"] = {name: p["status_patches"] for name, p in self.phases.items()}
        out["phases"] = self.phases
        return out


def measure(pods: int, groups: int, emulator: Emulator) -> dict[str, Any]:
    """The bench on fake time, in a thread of its own (kopf takes the signals of the
    thread it runs in when that is the main one)."""
    results: list[dict[str, Any]] = []
    failed: list[BaseException] = []

    def main() -> None:
        loop = looptime.new_event_loop(noop_cycles=42)
        try:
            results.append(loop.run_until_complete(Bench(pods, groups, emulator).run()))
        except BaseException as e:
            failed.append(e)
        finally:
            loop.close()

    quiet = [logging.getLogger(name) for name in ("kopf", "aiohttp.access", "httpx")]
    levels = [log.level for log in quiet]
    for log in quiet:  # a line per handler and per request: 1,024 pods' worth
        log.setLevel(logging.WARNING)
    try:
        thread = threading.Thread(target=main, name="bench-operator", daemon=True)
        thread.start()
        thread.join()
    finally:
        for log, level in zip(quiet, levels, strict=True):
            log.setLevel(level)
    if failed:
        raise failed[0]
    return results[0]


def main(pods: int, groups: int, emulator: Callable[[], Emulator]) -> dict[str, Any]:
    """Prints the bench's JSON on one line; `emulator` makes the API server."""
    out = measure(pods, groups, emulator())
    print(json.dumps(out))
    return out
