"""Control loop bench: what one control cycle costs at pool scale, on the real loop.

The operator runs one `ControlLoop` per run, and every period it must observe every
worker, plan and act before the next period starts; a loop that cannot keep its period
at a thousand workers paces nothing. This bench measures that on the real pieces over
real HTTP on 127.0.0.1: `workers` emulated workers (`worker/host.py`, many per host
process, on the emulated engine), the trainer service (`cadence trainer`, its ledger in
SQLite) and, in this process, `ControlLoop` with the Cadence policy, cycling every
`period_s` as the operator runs it (`ControlLoop.run`).

The workload is a long-tailed one, as `manifests/examples/longtail.yaml` scaled up: half
H800, half A910X workers serving Qwen3-8B, about 1,600 tokens of KV each (some 25
residents), response lengths lognormal (median 48 tokens, up to 512), eta 1. Its batch
is sized so the first version's work outlasts the bench, and no larger (Cadence admits
the whole admission window at once, and the ledger the loop reads lists every admitted
sample): the loop stays in its phase of placing and shedding, and no weights are
advanced (advancing is the data plane's cost). The fresh work admitted at the start
drains as the bench runs, so a long run's ledger shrinks.

The tokens come from `RandomTokenSource` (seeded random ids, no model): a tiny model per
worker would cost a forward pass a step, which a thousand workers on a few cores cannot
afford, and the control plane never reads a token. The emulated accelerators run at
`compression` of their modelled speed (a step takes 1/compression times its modelled
time; at the default 0.01 an H800 step is about 0.7 s, an A910X one 1.4 s), slow enough
that the hosts keep pace on a small machine; `workers_fell_behind` says whether they
did. `residents_mean` and `actions_per_cycle` say how much the loop had to plan.

The first `warmup_s` seconds (the pool filling) are run but not measured; then
`seconds` are. Figures, over the measured cycles:

- `cycle_ms_*`, `ledger_ms_p95`, `observe_ms_p95`, `reconcile_ms_p95`, `plan_ms_p95`,
  `apply_ms_p95`: the loop's own `CycleReport` (the ledger is read while the workers are
  observed; reconciling includes building the snapshot).
- `cpu_ms_p50`, `cpu_ms_p95`: the CPU time the loop's thread spent in a cycle, its own
  work without the waiting. The hosts, the trainer and the loop share this machine's
  cores, so a cycle's wall time includes waiting for hosts that are busy emulating; on
  a cluster the workers run elsewhere and the loop pays its CPU time.
- `idle_gc_per_cycle`, `idle_gc_ms_max`: how often Python's full garbage collection ran
  in the idle time after a cycle, and its longest run. The loop runs it there, not
  inside a cycle (`operator/control/idle_gc.py`); it is in neither `cycle_ms` nor
  `cpu_ms`, and a run that leaves too little of the period shows as lateness.
- `cycles_skipped`: cycles that started more than one period after they were due, so a
  whole period passed with no cycle started. A cycle is due one period after the start
  of the one before (`ControlLoop.run` sleeps out the rest of the period, or not at all
  after a cycle longer than the period); `late_ms_max` is the largest lateness.
- `cycles_failed`: cycles that started and reported nothing: `ControlLoop.run` gave them
  up because the trainer or a worker host could not be reached.
- `bytes_observed_per_cycle`: bytes of the answers to `GET /v1/states` (every worker's
  state) a cycle read, mean; `bytes_ledger_per_cycle`: the ledger's answer;
  `bytes_actions_per_cycle`: bytes sent and received by the action calls (evict, place,
  advance, fence, admit, record, requeue).
- `observed_min`: the fewest workers one cycle's observation saw (all: `workers`).
- `rss_start_mb`, `rss_end_mb`, `rss_growth`: the resident memory of this process (the
  loop; the hosts and the trainer are processes of their own) when the measured window
  began and ended, and (end - start) / start.

The bench ends with the first cycle to end after `warmup_s + seconds`. Prints one JSON
object.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from cadence.operator.api.capacity import check_pair, group_plans
from cadence.operator.api.resources import RolloutPool, TrainingRun
from cadence.operator.api.settings import budgets_of, knobs_of, trainer_config
from cadence.operator.control.config import CycleReport, LoopConfig
from cadence.operator.control.loop import ControlLoop
from cadence.scheduler.registry import POLICIES
from cadence.trainer.client import TrainerClient
from cadence.worker.api import WorkerState

MODEL = "Qwen3-8B"
ACCELERATOR_MIX = (("H800", 2), ("A910X", 1))  # (accelerator, affinity rank)
MEMORY_SHARE = {"H800": 0.2328, "A910X": 0.2708}  # about 1,600 tokens of KV each
MEDIAN_TOKENS, MAX_TOKENS = 48, 512
GROUP_SIZE, ETA = 8, 1
# The admission window, (eta + 1) batches, is sized so the first version's work is not
# used up within the bench, and no larger: Cadence admits the whole window at once, and
# the loop reads every admitted sample in the ledger each period. A worker holds some 25
# residents (3 groups) and finishes about 0.04 groups a second at compression 0.01, in
# proportion to the compression; both are doubled here.
GROUPS_HELD_PER_WORKER = 6.0
GROUPS_PER_WORKER_S = 0.08 / 0.01  # at compression 1

# A child of this process asks Linux for SIGTERM when this process dies, so a bench
# killed outright leaves no hosts behind (as `operator/local/processes.py` does).
_PROLOGUE = f"""
import os, sys
if sys.platform == "linux":
    import ctypes
    ctypes.CDLL(None).prctl(1, {int(signal.SIGTERM)}, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != int(os.environ["CADENCE_BENCH_PARENT"]):
        sys.exit("cadence bench loop: the bench that started this host has exited")
"""


def resources(
    workers: int, period_s: float, seconds: float, compression: float
) -> tuple[RolloutPool, TrainingRun]:
    """The bench's pool and run, validated as a run file would be."""
    groups = []
    for i, (accelerator, affinity) in enumerate(ACCELERATOR_MIX):
        replicas = workers // len(ACCELERATOR_MIX) + (i < workers % len(ACCELERATOR_MIX))
        groups.append(
            {
                "name": accelerator.lower(),
                "accelerator": accelerator,
                "affinity": affinity,
                "replicas": replicas,
                "maxReplicas": max(replicas, 1),
                "engine": {
                    "maxModelLen": MAX_TOKENS + 88,
                    "memoryUtilization": MEMORY_SHARE[accelerator],
                },
            }
        )
    pool = RolloutPool.model_validate(
        {
            "apiVersion": "cadence.dev/v1alpha1",
            "kind": "RolloutPool",
            "metadata": {"name": "bench"},
            "spec": {"groups": [g for g in groups if g["replicas"]]},
        }
    )
    per_worker = GROUPS_HELD_PER_WORKER + seconds * compression * GROUPS_PER_WORKER_S
    batch_groups = max(8, math.ceil(workers * per_worker / (ETA + 1)))
    run = TrainingRun.model_validate(
        {
            "apiVersion": "cadence.dev/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "bench-loop"},
            "spec": {
                "pool": "bench",
                "model": {"catalog": MODEL},
                "dataset": {"task": "digits"},
                "scheduler": {
                    "policy": "cadence",
                    "eta": ETA,
                    "delta": "auto",
                    "hMin": "auto",
                    "controlPeriodS": period_s,
                },
                "batch": {
                    "promptsPerBatch": batch_groups,
                    "samplesPerPrompt": GROUP_SIZE,
                    "maxTokens": MAX_TOKENS,
                    "responseLengths": {
                        "law": "lognormal",
                        "medianTokens": MEDIAN_TOKENS,
                        "sigmaBetweenGroups": 0.6,
                        "sigmaWithinGroup": 0.9,
                    },
                    "iterations": 1,
                },
            },
        }
    )
    check_pair(pool, run)
    return pool, run


# --- the worker hosts (each a process of its own) ----------------------------------------


def host_main() -> None:
    """A worker host process: `python -c "...; host_main()" SPEC.json`."""
    spec = json.loads(Path(sys.argv[1]).read_text())
    asyncio.run(_serve_host(spec, os.environ["CADENCE_TOKEN"]))


async def _serve_host(spec: Mapping[str, Any], token: str) -> None:
    import uvicorn  # noqa: PLC0415

    from cadence.common import web  # noqa: PLC0415
    from cadence.common.catalog import ACCELERATORS, MODELS  # noqa: PLC0415
    from cadence.common.physics import Deployment, Efficiency, kv_capacity_tokens  # noqa: PLC0415
    from cadence.common.sources import Destinations  # noqa: PLC0415
    from cadence.worker.client import Peers, TrainerSender  # noqa: PLC0415
    from cadence.worker.core import WorkerCore  # noqa: PLC0415
    from cadence.worker.emulated import EmulatedEngine  # noqa: PLC0415
    from cadence.worker.engine import MonotonicClock  # noqa: PLC0415
    from cadence.worker.held import Identity  # noqa: PLC0415
    from cadence.worker.host import create_host_app  # noqa: PLC0415
    from cadence.worker.outbox import Outbox  # noqa: PLC0415
    from cadence.worker.randomsource import RandomTokenSource  # noqa: PLC0415

    clock = MonotonicClock()
    peers = Peers(token, destinations=Destinations.of(spec["trainer_url"]))
    # One sender for the host's workers: one connection pool to the trainer, not one each.
    sender = TrainerSender(spec["trainer_url"], token)
    cores = {}
    for w in spec["workers"]:
        model, accelerator = MODELS[spec["model"]], ACCELERATORS[w["accelerator"]]
        capacity = kv_capacity_tokens(model, accelerator, w["tp"], w["share"])
        deployment = Deployment(model, accelerator, w["tp"], capacity, Efficiency())
        source = RandomTokenSource(spec["vocab_size"], seed=w["seed"], avoid=spec["avoid"])
        engine = EmulatedEngine(deployment, source, clock=clock, compression=spec["compression"])
        cores[w["id"]] = WorkerCore(
            Identity(w["id"], w["accelerator"], w["affinity"]),
            engine,
            clock,
            peers.claim,
            peers.release,
            0,
            outbox=Outbox(sender, clock),
        )
    config = uvicorn.Config(
        create_host_app(cores, token),
        host="127.0.0.1",
        port=spec["port"],
        log_level="warning",
        http=web.http_protocol(),
    )
    await uvicorn.Server(config).serve()


# --- measuring -----------------------------------------------------------------------------


class _CountedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, counts: Counter[str], kind: str) -> None:
        self.inner, self.counts, self.kind = inner, counts, kind

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.counts[self.kind] += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class CountingTransport(httpx.AsyncBaseTransport):
    """The network, counting bytes by what they were for: `observe` (worker states:
    answers), `ledger` (the ledger's answers), `actions` (every other call of the loop,
    both ways: evict, place, advance, fence, admit, record, requeue)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.counts: Counter[str] = Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and path.endswith(("/v1/states", "/v1/state")):
            kind = "observe"
        elif request.method == "GET" and path.endswith("/v1/ledger"):
            kind = "ledger"
        else:
            kind = "actions"
            self.counts[kind] += int(request.headers.get("content-length", 0))
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _CountedStream(response.stream, self.counts, kind)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _rss_mb() -> float:
    """This process's resident set, from /proc (MB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


# --- the processes -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(code: str, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", _PROLOGUE + code, *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@contextlib.contextmanager
def _stopping(procs: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    try:
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 10.0
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def _healthy(url: str, proc: subprocess.Popen[bytes], log: Path, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    async with httpx.AsyncClient(timeout=5.0) as http:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if (await http.get(f"{url}/healthz")).status_code == 200:
                    return
            if proc.poll() is not None:
                raise RuntimeError(f"{url} exited with status {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not become healthy within {within_s:.0f} s")
            await asyncio.sleep(0.2)


def _make_model(path: Path) -> None:
    """The trainer's tiny model (it tokenises prompts and checks token ids), made in a
    child process: this one never imports torch, so its memory is the loop's alone."""
    code = (
        "import sys; from pathlib import Path; "
        "from cadence.worker.tinymodel import make_tiny_llama; make_tiny_llama(Path(sys.argv[1]))"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True)


# --- the bench -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    workers: int
    hosts: int
    seconds: float  # measured
    period_s: float
    warmup_s: float  # run first, not measured
    compression: float


async def _bench(tmp: Path, settings: Settings) -> dict[str, object]:
    workers, hosts = settings.workers, settings.hosts
    total_s = settings.seconds + settings.warmup_s
    pool, run = resources(workers, settings.period_s, total_s, settings.compression)
    model = tmp / "model"
    await asyncio.to_thread(_make_model, model)
    config = trainer_config(run, model, tmp / "trainer")
    (tmp / "trainer.json").write_text(config.model_dump_json())
    vocabulary = json.loads((model / "config.json").read_text())
    token = secrets.token_hex(16)
    env = {**os.environ, "CADENCE_TOKEN": token, "CADENCE_BENCH_PARENT": str(os.getpid())}
    logs = tmp / "logs"
    logs.mkdir()
    trainer_port = _free_port()
    trainer_url = f"http://127.0.0.1:{trainer_port}"
    procs = [
        _spawn(
            "from cadence.cli import entry; entry()",
            ["trainer", "--config", str(tmp / "trainer.json"), "--port", str(trainer_port)],
            env,
            logs / "trainer.log",
        )
    ]
    with _stopping(procs):
        plans = group_plans(pool, run)
        pool_workers = [
            (f"{g.name}-{i}", g.accelerator, g.affinity, *plans[g.name])
            for g in pool.spec.groups
            for i in range(g.replicas)
        ]
        host_urls: dict[str, list[str]] = {}
        for h in range(hosts):
            port = _free_port()
            mine = pool_workers[h::hosts]
            spec = {
                "port": port,
                "trainer_url": trainer_url,
                "model": MODEL,
                "compression": settings.compression,
                "vocab_size": vocabulary["vocab_size"],
                "avoid": [vocabulary["eos_token_id"]],
                "workers": [
                    {
                        "id": wid,
                        "accelerator": acc,
                        "affinity": aff,
                        "tp": tp,
                        "share": MEMORY_SHARE[acc],
                        "seed": n,
                    }
                    for n, (wid, acc, aff, tp, _kv) in enumerate(mine, start=h * workers)
                ],
            }
            (tmp / f"host-{h}.json").write_text(json.dumps(spec))
            code = "from cadence.bench.loop import host_main; host_main()"
            log = logs / f"host-{h}.log"
            procs.append(_spawn(code, [str(tmp / f"host-{h}.json")], env, log))
            host_urls[f"http://127.0.0.1:{port}"] = [w[0] for w in mine]
        await _healthy(trainer_url, procs[0], logs / "trainer.log", within_s=120)
        for h, (url, proc) in enumerate(zip(host_urls, procs[1:], strict=True)):
            await _healthy(url, proc, logs / f"host-{h}.log", within_s=120)
        figures = await _measure(run, settings, host_urls, trainer_url, token=token)
        return figures | {"compression": settings.compression}


async def _measure(
    run: TrainingRun,
    settings: Settings,
    host_urls: dict[str, list[str]],
    trainer_url: str,
    *,
    token: str,
) -> dict[str, object]:
    seconds, period_s, warmup_s = settings.seconds, settings.period_s, settings.warmup_s
    transport = CountingTransport()
    trainer = TrainerClient(trainer_url, token, transport=transport)
    observed: list[int] = []
    last: dict[str, Mapping[str, WorkerState]] = {}

    def on_observe(states: Mapping[str, WorkerState]) -> None:
        observed.append(len(states))
        last["states"] = states

    loop = ControlLoop(
        POLICIES["cadence"](),
        LoopConfig(knobs=knobs_of(run), period_s=period_s, budgets=budgets_of(run)),
        trainer,
        {w: f"{url}/{w}" for url, ids in host_urls.items() for w in ids},
        token,
        hosts=host_urls,
        transport=transport,
        on_observe=on_observe,
    )
    started = time.monotonic()
    measured_from = started + warmup_s
    ends = measured_from + seconds
    starts: list[float] = []  # when each cycle started (done() is asked just before)
    reports: list[CycleReport] = []
    window: dict[str, Any] = {}  # what the measured window began with

    async def done() -> bool:
        now = time.monotonic()
        if loop.totals["cycles"] > len(reports):  # the cycle before this call completed
            reports.append(loop.reports[-1])
        if not window and now >= measured_from:
            window.update(
                rss=_rss_mb(),
                cycle=len(starts),
                report=len(reports),
                observed=len(observed),
                bytes=Counter(transport.counts),
                totals=loop.totals,
            )
        if now >= ends:
            return True
        starts.append(now)
        return False

    try:
        await loop.run(done)
    finally:
        await loop.aclose()
        await trainer.aclose()
    rss_end = _rss_mb()
    first = window["cycle"]
    late = [
        (starts[i] - starts[i - 1] - period_s) * 1000 for i in range(max(1, first), len(starts))
    ]
    measured = reports[window["report"] :]
    cycles = len(starts) - first
    sent = transport.counts - window["bytes"]
    totals = loop.totals - window["totals"]
    states = last.get("states", {})
    residents = [len(s.residents) for s in states.values()]

    def p(values: list[float], q: float) -> float:
        return round(_quantile(values, q), 1)

    return {
        "bench": "loop",
        "workers": settings.workers,
        "hosts": settings.hosts,
        "period_s": period_s,
        "seconds": seconds,
        "warmup_s": warmup_s,
        "cycles": cycles,
        "cycles_failed": cycles - len(measured),
        "cycle_ms_p50": round(statistics.median(r.cycle_ms for r in measured), 1)
        if measured
        else 0.0,
        "cycle_ms_p95": p([r.cycle_ms for r in measured], 0.95),
        "cycle_ms_max": p([r.cycle_ms for r in measured], 1.0),
        "ledger_ms_p95": p([r.ledger_ms for r in measured], 0.95),
        "observe_ms_p95": p([r.observe_ms for r in measured], 0.95),
        "plan_ms_p95": p([r.plan_ms for r in measured], 0.95),
        "apply_ms_p95": p([r.apply_ms for r in measured], 0.95),
        "reconcile_ms_p95": p([r.reconcile_ms for r in measured], 0.95),
        "cpu_ms_p50": p([r.cpu_ms for r in measured], 0.5),
        "cpu_ms_p95": p([r.cpu_ms for r in measured], 0.95),
        "idle_gc_per_cycle": round(sum(r.idle_gc_ms > 0 for r in measured) / max(1, cycles), 2),
        "idle_gc_ms_max": p([r.idle_gc_ms for r in measured], 1.0),
        "cycles_skipped": sum(x > period_s * 1000 for x in late),
        "late_ms_max": round(max(late, default=0.0), 1),
        "observed_min": min(observed[window["observed"] :], default=0),
        "bytes_observed_per_cycle": round(sent["observe"] / max(1, cycles)),
        "bytes_ledger_per_cycle": round(sent["ledger"] / max(1, cycles)),
        "bytes_actions_per_cycle": round(sent["actions"] / max(1, cycles)),
        "actions_per_cycle": {
            k: round(totals[k] / max(1, cycles), 1) for k in ("admit", "place", "evict", "advance")
        },
        "action_errors": totals["errors"],
        "requeued": totals["requeued"],
        "workers_lost": len(loop.lost),
        "residents_mean": round(statistics.fmean(residents), 1) if residents else 0.0,
        "workers_fell_behind": sum(s.fell_behind for s in states.values()),
        "rss_start_mb": round(window["rss"], 1),
        "rss_end_mb": round(rss_end, 1),
        "rss_growth": round((rss_end - window["rss"]) / window["rss"], 4),
    }


def main(
    workers: int,
    *,
    hosts: int,
    seconds: float,
    period_s: float = 1.0,
    warmup_s: float = 30.0,
    compression: float = 0.01,
) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="cadence-bench-loop-") as tmp:
        settings = Settings(workers, hosts, seconds, period_s, warmup_s, compression)
        out = asyncio.run(_bench(Path(tmp), settings))
    print(json.dumps(out))
    return out
