"""The control loop: the I/O shell around the pure scheduler (docs/architecture.md,
"Boundaries").

Every period it reads the trainer's ledger (what changed since the last period,
`ledger_copy.py`) and observes every worker (`GET /v1/state`,
or a host's `GET /v1/states`, all concurrently, with a timeout), reconciles the two,
builds the scheduler's snapshot, calls the policy, and applies its actions through the
endpoints: evict, place (fresh, with the group's prompt; departed, naming the worker it
is parked on), advance (with the trainer's weights URI and sha256), admit (the trainer's
cursor). It holds ids and lengths only, and nothing it holds is needed across a restart:
a new loop rebuilds its view from the workers and the ledger.

Reconciling: the ledger is told where each in-flight sample is (placed, parked, waiting
for its environment). A sample the ledger shows in flight that no live worker holds
(resident, parked or in its outbox) is re-queued from its prompt under a new attempt;
so is everything on a worker that has not answered for `lost_after_s`, or that says its
decoding has stalled. Such a worker is lost, not dead: it is asked again with a backoff,
and once it answers (and steps) it rejoins the pool; the copies it still holds under
attempts the ledger has moved past are fenced off (dropped there). A placement is
recorded in the ledger before it is made, under its new attempt, so the delivery it
produces is the current attempt's; if the worker refuses it, the sample goes back
(fresh samples to the fresh pool, departed ones to the worker they are parked on).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cadence.common.clock import loop_time
from cadence.common.errors import describe
from cadence.operator.control.apply import ActionApplier
from cadence.operator.control.config import CycleReport, LoopConfig
from cadence.operator.control.idle_gc import IdleCollector, collecting_between_cycles
from cadence.operator.control.ledger_copy import LedgerCopy
from cadence.operator.control.trace import TraceRecorder
from cadence.scheduler.actions import Action, Evict, EvictReason
from cadence.scheduler.cost import StepCost, floor_warning
from cadence.scheduler.policy import Policy
from cadence.scheduler.snapshot import (
    Admission,
    PendingTrajectory,
    Resident,
    Snapshot,
    Transfer,
    WorkerView,
)
from cadence.trainer.api import LedgerView, Record, VersionInfo
from cadence.trainer.client import TrainerClient, TrainerError
from cadence.worker.api import (
    Fence,
    MoveCounts,
    ResidentInfo,
    WorkerState,
)
from cadence.worker.client import HostClient, WorkerClient
from cadence.worker.state_progress import Observed

log = logging.getLogger("cadence.loop")

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class ControlLoop(ActionApplier):
    policy: Policy[Any]
    config: LoopConfig
    trainer: TrainerClient
    workers: dict[str, str]  # worker id -> URL (copied: workers join as the pool changes)
    token: str
    # Host URL -> the workers it hosts (`worker/host.py`): observed, evicted from and
    # placed on with one call per host and phase.
    hosts: Mapping[str, Sequence[str]] = field(default_factory=dict)
    clock: Callable[[], float] = loop_time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep  # between cycles, on `clock`
    # How worker and host clients reach their URLs (tests route them to in-process apps;
    # None is the network). The trainer client is built by the caller, with its own.
    transport: httpx.AsyncBaseTransport | None = None
    # Called with every cycle's observed states (a live view, a report's timeline).
    on_observe: Callable[[Mapping[str, WorkerState]], None] | None = None
    trace: TraceRecorder | None = None  # opened by its owner; written every cycle
    # Tokens each worker's engine has decoded since it started, as last observed (its
    # decode steps' sequences; absent where the engine does not time its steps).
    decoded: dict[str, int] = field(default_factory=dict)
    state: Any = None
    reports: list[CycleReport] = field(default_factory=list)
    # How long each advance took (fetch, check and load the weights), the last 1,000.
    advance_seconds: list[float] = field(default_factory=list)
    _clients: dict[str, WorkerClient] = field(default_factory=dict)
    _silent_since: dict[str, float] = field(default_factory=dict)
    _lost: set[str] = field(default_factory=set)
    # Lost workers: when each is next asked, the wait after that, and the probe in flight.
    _probe_at: dict[str, tuple[float, float]] = field(default_factory=dict)
    _probes: dict[str, asyncio.Task[WorkerState]] = field(default_factory=dict)
    _all_lost_logged: float = float("-inf")
    _pending_since: dict[str, float] = field(default_factory=dict)
    _totals: Counter[str] = field(default_factory=Counter)  # actions, errors, requeued
    _moves: dict[str, MoveCounts] = field(default_factory=dict)  # each worker's, last seen
    # Advances in flight (fetching and loading weights takes long): the worker is left
    # out of planning until its advance ends, so cycles stay short; it is still observed,
    # so one that goes silent mid-advance is lost like any other.
    _advancing: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _versions: dict[int, VersionInfo] = field(default_factory=dict)
    # The last cycle's snapshot and plan (the operator reports per-group demand from it),
    # and the plan's actions that took effect (a worker refuses what it no longer holds).
    last_plan: tuple[Snapshot, tuple[Action, ...]] | None = None
    last_applied: tuple[Action, ...] = ()
    _refused: list[Action] = field(default_factory=list)  # this cycle's, as _apply goes
    # Workers on which a pinned h_min is below one period's growth, with the sentence.
    floor_warnings: dict[str, str] = field(default_factory=dict)
    _closing: set[asyncio.Future[None]] = field(default_factory=set)  # clients of gone workers
    _left: set[str] = field(default_factory=set)  # workers removed: what they held is re-queued
    # This cycle's observations, and what each resident decoded since its worker's whole
    # state (worker -> resident -> tokens; the hosts send progress, `worker/state_progress.py`).
    _observed: dict[str, Observed] = field(default_factory=dict)
    _grown: dict[str, dict[str, int]] = field(default_factory=dict)
    # Built from a worker's whole state, kept while the state is the same object (a host
    # sent progress on it): what it holds, for reconciling, and its view, for planning.
    _held: dict[str, tuple[WorkerState, dict[str, tuple[str, str, int]]]] = field(
        default_factory=dict
    )
    _views: dict[str, tuple[WorkerState, dict[str, int] | None, WorkerView]] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = self.policy.initial_state()
        self.workers = dict(self.workers)
        self._ledger = LedgerCopy(self.trainer)
        self._hosts: dict[str, HostClient] = {}
        self._host_of: dict[str, str] = {}
        for url, ws in self.hosts.items():
            self._add_host(url, ws)
        for wid, url in self.workers.items():
            self._clients[wid] = self._client(url)

    def _client(self, url: str) -> WorkerClient:
        return WorkerClient(
            url, self.token, timeout_s=self.config.state_timeout_s, transport=self.transport
        )

    def _add_host(self, url: str, ids: Sequence[str]) -> None:
        self._hosts[url] = HostClient(
            url, self.token, timeout_s=self.config.state_timeout_s, transport=self.transport
        )
        self._host_of.update(dict.fromkeys(ids, url))

    def add_workers(self, urls: Mapping[str, str], host: str | None = None) -> None:
        """Workers that joined the pool (a replacement, a scale-out), from the next
        cycle on; `host` is the URL of the host process they share, if they do. A worker
        already known joins afresh (a pod recreated under its name, at a new address):
        whatever the loop concluded about the one before, lost or silent, is forgotten."""
        if host is not None:
            self._add_host(host, list(urls))
        for wid, url in urls.items():
            if wid in self._clients:
                self._forget(wid)
            self._left.discard(wid)
            self.workers[wid] = url
            self._clients[wid] = self._client(url)

    def remove_workers(self, ids: Iterable[str]) -> None:
        """Workers that left the pool (their pods are gone): never asked again. What they
        held is found nowhere by the next reconcile and re-queued."""
        for wid in ids:
            self._forget(wid)
            self.workers.pop(wid, None)
            self._left.add(wid)

    def _forget(self, wid: str) -> None:
        client = self._clients.pop(wid, None)
        if client is not None:
            closing = asyncio.get_running_loop().create_task(client.aclose())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        for task in (self._probes.pop(wid, None), self._advancing.pop(wid, None)):
            if task is not None:
                task.cancel()
        self._lost.discard(wid)
        self._probe_at.pop(wid, None)
        self._silent_since.pop(wid, None)

    @property
    def lost(self) -> frozenset[str]:
        return frozenset(self._lost)

    @property
    def totals(self) -> Counter[str]:
        """Actions applied by kind, errors, re-queued samples and cycles, since start."""
        return Counter(self._totals)

    @property
    def moves(self) -> MoveCounts:
        """Moves into every worker observed so far, by kind (a lost worker's as it last
        reported them)."""
        summed = {
            k: sum(getattr(m, k) for m in self._moves.values()) for k in MoveCounts.model_fields
        }
        return MoveCounts(**summed)

    async def aclose(self) -> None:
        tasks = [*self._advancing.values(), *self._probes.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *self._closing, return_exceptions=True)
        for c in self._clients.values():
            await c.aclose()
        for h in self._hosts.values():
            await h.aclose()

    async def run(self, done: Callable[[], Awaitable[bool]]) -> None:
        """Cycle every `period_s` until `done()`. A cycle that cannot reach the trainer
        is skipped and retried next period: the loop outlives a trainer restart. Python's
        full garbage collection runs between cycles, not inside them (`idle_gc.py`)."""
        collector = IdleCollector()
        with collecting_between_cycles():
            while not await done():
                started = self.clock()
                report = None
                try:
                    report = await self.cycle()
                except (TrainerError, OSError, httpx.TransportError) as e:
                    log.warning("cycle skipped: %s", describe(e))
                idle_ms = collector.after_cycle(self.config.period_s - (self.clock() - started))
                if report is not None:
                    report.idle_gc_ms = idle_ms
                await self.sleep(max(0.0, self.config.period_s - (self.clock() - started)))

    # --- one cycle ---------------------------------------------------------------------

    async def cycle(self) -> CycleReport:
        t0, cpu0 = time.perf_counter(), time.thread_time()
        # The ledger and the workers are read at once. A sample delivered between the two
        # reads shows in flight in one and held nowhere in the other; re-queueing it is
        # refused (409) because it was delivered, so the race loses nothing.
        (view, ledger_ms), (live, observe_ms) = await asyncio.gather(
            _timed(self._ledger.read()), _timed(self._observe())
        )
        if self.on_observe is not None:
            self.on_observe(_Current(self._observed))
        if self.trace is not None:
            self.trace.observed(live)
        for wid, st in live.items():
            if st.decode_steps is not None:
                self.decoded[wid] = st.decode_steps.sequences
        observed = time.perf_counter()
        requeued = await self._reconcile(view, live)
        if requeued:
            view = await self._ledger.read()
        now = self.clock()
        planned = {w: st for w, st in live.items() if w not in self._advancing}
        snapshot = self._snapshot(view, planned, now)
        t1 = time.perf_counter()
        actions, self.state = self.policy.plan(snapshot, self.state)
        plan_ms = (time.perf_counter() - t1) * 1000
        self.last_plan = (snapshot, tuple(actions))
        counts = Counter(type(a).__name__.lower() for a in actions)
        t2 = time.perf_counter()
        self._refused = []
        errors = await self._apply(actions, view, {p.id: p for p in snapshot.pending})
        refused = {id(a) for a in self._refused}
        self.last_applied = tuple(a for a in actions if id(a) not in refused)
        applied = Counter(type(a).__name__.lower() for a in self.last_applied)
        report = CycleReport(
            cycle_ms=(time.perf_counter() - t0) * 1000,
            ledger_ms=ledger_ms,
            observe_ms=observe_ms,
            plan_ms=plan_ms,
            apply_ms=(time.perf_counter() - t2) * 1000,
            reconcile_ms=(t1 - observed) * 1000,
            cpu_ms=(time.thread_time() - cpu0) * 1000,
            actions=counts,
            errors=errors,
            requeued=requeued,
            lost=sorted(self._lost),
        )
        self.reports.append(report)
        del self.reports[:-1000]
        self._totals.update(applied)
        self._totals["errors"] += errors
        self._totals["requeued"] += requeued
        self._totals["cycles"] += 1
        self._totals["departures"] += sum(
            isinstance(a, Evict) and a.reason == EvictReason.SOURCE for a in self.last_applied
        )
        if self.trace is not None:
            self.trace.applied(snapshot, self.last_applied)
            try:
                await self.trace.read_trainer()
            except (TrainerError, OSError, httpx.TransportError) as e:
                log.debug("trace: the trainer's deliveries wait for the next read: %s", describe(e))
        return report

    def collector(self) -> Collector:
        """Prometheus metrics of this loop, read at scrape time."""
        return _LoopCollector(self)

    async def _observe(self) -> dict[str, WorkerState]:
        self._probe_lost()
        ids = [w for w in self._clients if w not in self._lost]
        alone = [w for w in ids if w not in self._host_of]
        wanted = sorted({self._host_of[w] for w in ids if w in self._host_of})
        results = await asyncio.gather(
            *(self._clients[w].state() for w in alone),
            *(self._hosts[url].states() for url in wanted),
            return_exceptions=True,
        )
        answers: dict[str, object] = {
            w: Observed(r) if isinstance(r, WorkerState) else r
            for w, r in zip(alone, results, strict=False)
        }
        for url, result in zip(wanted, results[len(alone) :], strict=True):
            for w in self.hosts[url]:
                answers[w] = result.get(w) if isinstance(result, dict) else result
        live = {}
        self._observed, self._grown = {}, {}
        now = self.clock()
        for wid in ids:
            result = answers.get(wid)
            if isinstance(result, Observed) and result.whole.stalled is not None:
                log.warning("worker %s is lost: %s", wid, result.whole.stalled)
                self._lose(wid, now)
                continue
            if isinstance(result, Observed):
                st = live[wid] = result.whole
                self._observed[wid] = result
                if result.progress is not None:
                    rs, decoded = st.residents, result.progress.decoded
                    self._grown[wid] = {r.id: d for r, d in zip(rs, decoded, strict=True) if d}
                self._moves[wid] = st.moves
                self._silent_since.pop(wid, None)
                continue
            since = self._silent_since.setdefault(wid, now)
            if now - since >= self.config.lost_after_s:
                log.warning("worker %s is lost: silent for %.1f s", wid, now - since)
                self._lose(wid, now)
        everyone = bool(self._clients) and len(self._lost) == len(self._clients)
        if everyone and now - self._all_lost_logged >= self.config.max_probe_lost_s:
            self._all_lost_logged = now
            log.warning(
                "all %d workers are lost; asking each again every %.0f s at most",
                len(self._clients),
                self.config.max_probe_lost_s,
            )
        return live

    def _lose(self, wid: str, now: float) -> None:
        self._lost.add(wid)
        self._totals["lost"] += 1
        advancing = self._advancing.pop(wid, None)
        if advancing is not None:  # its advance call would wait out its long timeout
            advancing.cancel()
        self._silent_since.pop(wid, None)
        self._probe_at[wid] = (now + self.config.probe_lost_s, self.config.probe_lost_s)

    def _probe_lost(self) -> None:
        """Take back the lost workers that answered their last probe; ask the others again
        when it is their time. A probe runs beside the cycles, so a silent worker never
        holds one up. What a returning worker still holds under attempts the ledger has
        moved past is fenced off when the cycle reconciles."""
        now = self.clock()
        for wid in sorted(self._lost):
            task = self._probes.get(wid)
            if task is not None:
                if not task.done():
                    continue
                del self._probes[wid]
                if not task.cancelled() and task.exception() is None and not task.result().stalled:
                    self._lost.discard(wid)
                    self._probe_at.pop(wid, None)
                    log.warning("worker %s answers again; it rejoins the pool", wid)
                    self._totals["rejoined"] += 1
                    continue
                _, wait = self._probe_at[wid]
                wait = min(self.config.max_probe_lost_s, 2 * wait)
                self._probe_at[wid] = (now + wait, wait)
                continue
            if now >= self._probe_at[wid][0] and wid in self._clients:
                self._probes[wid] = asyncio.create_task(self._clients[wid].state())

    async def _reconcile(self, view: LedgerView, live: dict[str, WorkerState]) -> int:
        await self._fence(view, live)
        held: dict[str, tuple[str, str, int]] = {}  # id -> (worker, state, attempt)
        kept, self._held = self._held, {}
        for wid, st in live.items():
            entry = kept.get(wid)
            if entry is None or entry[0] is not st:  # a worker's whole state, once
                entry = (st, _held_on(wid, st))
            self._held[wid] = entry
            held.update(entry[1])
        requeued = 0
        moved = []
        for s in view.in_flight:
            where = held.get(s.id)
            if where is not None:
                wid, state, _ = where
                if state != "delivering" and (wid, state) != (s.worker, s.state):
                    moved.append(Record(id=s.id, attempt=s.attempt, state=state, worker=wid))  # type: ignore[arg-type]
                continue
            gone = s.worker in self._lost or s.worker in self._left
            if s.worker is not None and s.worker not in live and not gone:
                continue  # its worker is silent (or not yet known) but not lost: wait
            if s.worker in self._advancing:
                continue  # placed after the worker's advance, that call still in flight
            # Gone with its worker (lost, or left the pool), or dropped by a live one (a
            # failed step, a refused delivery): only the second is the sample's fault.
            fault: Literal["sample", "worker"] = "sample" if s.worker in live else "worker"
            try:
                await self.trainer.requeue(s.id, fault)
                requeued += 1
            except TrainerError as e:
                if e.status != 409:  # 409: it was delivered meanwhile
                    raise
        await self.trainer.record_many(moved)
        return requeued

    async def _fence(self, view: LedgerView, live: dict[str, WorkerState]) -> None:
        """Fence off the copies workers hold under attempts the ledger has moved past (a
        worker taken for lost that answers again, a placement that landed after it timed
        out): each worker drops them, and this cycle plans without them. A resident is
        stale under any newer attempt; a parked copy only once its sample went back to
        fresh (a departed sample is recorded under its next attempt before it is claimed);
        any copy once its sample has ended."""
        fresh = {f.id: f.attempt for f in view.fresh}
        current = fresh | {s.id: s.attempt for s in view.in_flight}
        stale: dict[str, list[Fence]] = {}
        for wid, st in live.items():
            # A sample neither fresh nor in flight has ended: any copy of it is stale.
            items = [
                Fence(id=r.id, attempt=current.get(r.id, r.attempt + 1))
                for r in st.residents
                if r.attempt < current.get(r.id, r.attempt + 1)
            ]
            items += [
                Fence(id=p.id, attempt=fresh.get(p.id, p.attempt + 1))
                for p in st.parked
                if (p.id in fresh or p.id not in current)
                and p.attempt < fresh.get(p.id, p.attempt + 1)
            ]
            if not items:
                continue
            stale[wid] = items
            gone = {f.id for f in items}
            live[wid] = st.model_copy(
                update={
                    "residents": [r for r in st.residents if r.id not in gone],
                    "parked": [p for p in st.parked if p.id not in gone],
                }
            )
        if not stale:
            return
        results = await self._gather(self._clients[w].fence(items) for w, items in stale.items())
        for wid, result in zip(stale, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("fencing stale copies on %s failed: %r", wid, result)
            else:
                self._totals["fenced"] += len(result)

    def _snapshot(self, view: LedgerView, live: dict[str, WorkerState], now: float) -> Snapshot:
        workers, pending = [], []
        kept, self._views = self._views, {}
        for wid, st in sorted(live.items()):
            grown = self._grown.get(wid)
            cached = kept.get(wid)
            if cached is not None and cached[0] is st and cached[1] == grown:
                worker = cached[2]  # the same whole state, decoded no further
            else:
                if cached is not None and cached[0] is st:
                    cost = cached[2].cost
                else:
                    cost = StepCost(**st.step_cost.model_dump()) if st.step_cost else None
                worker = WorkerView(
                    id=wid,
                    accelerator=st.accelerator,
                    affinity=st.affinity,
                    version=st.version,
                    capacity=st.kv_capacity_tokens,
                    residents=_residents(st.residents, grown),
                    draining=st.draining,
                    max_seqs=st.max_seqs,
                    cost=cost,
                    transfer_group=st.transfer_group,
                )
            self._views[wid] = (st, grown, worker)
            workers.append(worker)
            for p in st.parked:
                pending.append(
                    PendingTrajectory(
                        id=p.id,
                        version=p.version,
                        context=p.context,
                        since=self._pending_since.setdefault(p.id, now),
                        placeable=p.reason != "environment" and p.claimed_until is None,
                        parked_on=wid,
                    )
                )
        parked_ids = {p.id for p in pending}
        for sid in list(self._pending_since):
            if sid not in parked_ids:
                del self._pending_since[sid]
        fresh = self._ledger.index  # the view's fresh samples, kept sorted as they change
        self._check_floor(workers)
        links = [
            (st.kv_bytes_per_token, st.kv_link_bytes_per_s)
            for st in live.values()
            if st.kv_bytes_per_token is not None and st.kv_link_bytes_per_s is not None
        ]
        # One model per run; the slowest link any worker reports prices every pull.
        transfer = Transfer(max(b for b, _ in links), min(s for _, s in links)) if links else None
        return Snapshot(
            now=now,
            workers=tuple(workers),
            pending=tuple(pending),
            fresh=tuple(fresh.samples.values()),
            fresh_index=fresh.by_batch(),
            newest_version=view.version,
            admission=Admission(view.cursor, view.batch_groups, view.total_groups),
            knobs=self.config.knobs,
            transfer=transfer,
        )

    def _check_floor(self, workers: Sequence[WorkerView]) -> None:
        knobs = self.config.knobs
        if knobs.auto_h_min:
            return
        for w in workers:
            if w.cost is None or w.max_seqs is None or w.id in self.floor_warnings:
                continue
            period = knobs.control_period_s
            said = floor_warning(
                f"worker {w.id}",
                knobs.h_min,
                w.cost,
                w.max_seqs,
                capacity=w.capacity,
                period_s=period,
            )
            if said is not None:
                self.floor_warnings[w.id] = said
                log.warning("%s", said)


def _held_on(wid: str, st: WorkerState) -> dict[str, tuple[str, str, int]]:
    """What `st` says `wid` holds: each id's (worker, state, attempt), as the ledger
    records it (a delivering one's attempt is not read)."""
    held = {r.id: (wid, "placed", r.attempt) for r in st.residents}
    for p in st.parked:
        held[p.id] = (wid, "environment" if p.reason == "environment" else "parked", p.attempt)
    for d in st.delivering:
        held[d] = (wid, "delivering", -1)
    return held


def _residents(
    residents: Sequence[ResidentInfo], grown: Mapping[str, int] | None
) -> tuple[Resident, ...]:
    """The residents as planned: as last received whole, plus what each decoded since
    (`grown`, from the host's progress)."""
    if not grown:
        return tuple(Resident(r.id, r.context, r.decoded_since_placement) for r in residents)
    return tuple(
        Resident(r.id, r.context + (d := grown.get(r.id, 0)), r.decoded_since_placement + d)
        for r in residents
    )


class _Current(Mapping[str, WorkerState]):
    """The observed workers' current states, each built when it is read: a reader that
    only counts them (or reads a few) builds none of the rest."""

    def __init__(self, observed: Mapping[str, Observed]) -> None:
        self._observed = observed

    def __getitem__(self, wid: str) -> WorkerState:
        return self._observed[wid].current()

    def __iter__(self) -> Iterator[str]:
        return iter(self._observed)

    def __len__(self) -> int:
        return len(self._observed)


async def _timed(call: Awaitable[R]) -> tuple[R, float]:
    started = time.perf_counter()
    result = await call
    return result, (time.perf_counter() - started) * 1000


class _LoopCollector(Collector):
    def __init__(self, loop: ControlLoop) -> None:
        self.loop = loop

    def collect(self) -> Iterable[Metric]:
        loop = self.loop
        cycles = CounterMetricFamily("cadence_loop_cycles", "Control cycles run.")
        cycles.add_metric([], loop._totals["cycles"])
        yield cycles
        last = GaugeMetricFamily("cadence_loop_cycle_ms", "The last cycle's duration, ms.")
        last.add_metric([], loop.reports[-1].cycle_ms if loop.reports else 0.0)
        yield last
        actions = CounterMetricFamily(
            "cadence_loop_actions", "Actions applied, by kind.", labels=["kind"]
        )
        for kind in ("evict", "place", "advance", "admit"):
            actions.add_metric([kind], loop._totals[kind])
        yield actions
        for name, doc in (("errors", "Actions that failed."), ("requeued", "Samples re-queued.")):
            c = CounterMetricFamily(f"cadence_loop_{name}", doc)
            c.add_metric([], loop._totals[name])
            yield c
        moves = loop.moves
        migrations = CounterMetricFamily(
            "cadence_loop_migrations",
            "Departed trajectories moved between workers, by how: KV pulled, or re-prefilled "
            "(fallbacks from a failed pull included).",
            labels=["kind"],
        )
        migrations.add_metric(["kv"], moves.kv)
        migrations.add_metric(["reprefill"], moves.reprefill)
        yield migrations
        fallbacks = CounterMetricFamily(
            "cadence_loop_kv_fallbacks", "KV pulls that failed or timed out and re-prefilled."
        )
        fallbacks.add_metric([], moves.kv_fallbacks)
        yield fallbacks
        lost = GaugeMetricFamily("cadence_loop_lost_workers", "Workers declared lost.")
        lost.add_metric([], len(loop._lost))
        yield lost
