"""How the control loop applies a plan: in phases (evictions, admission, placements,
advances in the background), each phase's calls concurrently and, where workers share a
host process, one call per host. A call that fails or is refused is counted and its
sample left for the next cycle's reconcile; nothing here decides what to do.

A mixin of `ControlLoop` (`loop.py`): the state it uses is declared below and owned
there."""

from __future__ import annotations

import asyncio
import functools
import logging
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import httpx

from cadence.operator.control.config import LoopConfig
from cadence.operator.control.ledger_copy import LedgerCopy
from cadence.scheduler.actions import Action, Admit, Advance, Evict, Place
from cadence.scheduler.snapshot import (
    PendingTrajectory,
)
from cadence.trainer.api import LedgerView, Record, VersionInfo, sample_index
from cadence.trainer.client import TrainerClient, TrainerError
from cadence.worker.api import (
    AdvanceRequest,
    FreshStart,
    PlaceRequest,
    Sampling,
    Source,
)
from cadence.worker.client import HostClient, WorkerClient, WorkerError

log = logging.getLogger("cadence.loop")

T = TypeVar("T")
R = TypeVar("R")

PARALLEL_CALLS = 64  # calls to workers in flight at once while a plan is applied


class ActionApplier:
    trainer: TrainerClient
    config: LoopConfig
    clock: Callable[[], float]
    workers: dict[str, str]
    advance_seconds: list[float]
    _advancing: dict[str, asyncio.Task[None]]
    _totals: Counter[str]
    _refused: list[Action]
    _clients: dict[str, WorkerClient]
    _versions: dict[int, VersionInfo]
    _hosts: dict[str, HostClient]
    _host_of: dict[str, str]
    _ledger: LedgerCopy

    async def _apply(
        self, actions: Sequence[Action], view: LedgerView, pending: dict[str, PendingTrajectory]
    ) -> int:
        """Apply a plan in phases, each phase's calls concurrently: evictions (so every
        placement finds the room and the parked state it was planned with), admission
        (a plan may place the samples it admits), placements; advances start in the
        background. Returns how many failed."""
        attempts = {s.id: s.attempt for s in view.in_flight}
        errors = 0
        evicts = [a for a in actions if isinstance(a, Evict)]
        results = await self._bulk(
            [(a.worker, a.trajectory) for a in evicts],
            lambda w, rid: self._clients[w].evict(rid, self.config.action_timeout_s),
            lambda host, items: self._hosts[host].evict(items, self.config.action_timeout_s),
        )
        parked = []
        for evict, result in zip(evicts, results, strict=True):
            if isinstance(result, BaseException):
                errors += 1
                self._refused.append(evict)
                log.warning("%s failed: %r", evict, result)
                continue
            attempt = attempts.get(evict.trajectory, result.attempt)
            parked.append(
                Record(id=evict.trajectory, attempt=attempt, state="parked", worker=evict.worker)
            )
            # Parked now: a placement in this same plan pulls it from there.
            pending[evict.trajectory] = PendingTrajectory(
                evict.trajectory,
                result.version,
                result.context,
                since=self.clock(),
                placeable=True,
                parked_on=evict.worker,
            )
        await self.trainer.record_many(parked)
        advancing = {a.worker for a in actions if isinstance(a, Advance)}
        places = [a for a in actions if isinstance(a, Place) and a.worker not in advancing]
        # A plan that interrupts a worker, advances it and resubmits its residents there
        # (AReaL-like) places them once the advance is done, from the advance's task.
        after: dict[str, list[Place]] = {}
        for a in actions:
            if isinstance(a, Place) and a.worker in advancing:
                after.setdefault(a.worker, []).append(a)
        groups = sum(a.groups for a in actions if isinstance(a, Admit))
        if groups:
            await self.trainer.admit(groups)
            known = {f.id for f in view.fresh} | set(pending)
            if any(a.trajectory not in known for a in places):
                # The plan places samples of the groups it admits (AReaL-like does):
                # they are in the ledger now, with their prompts.
                view = await self._ledger.read()
        errors += await self._place(places, view, pending, attempts)
        for action in actions:
            if isinstance(action, Advance) and action.worker not in self._advancing:
                then = functools.partial(
                    self._place, after.get(action.worker, []), view, pending, attempts
                )
                task = asyncio.create_task(self._advance(action, then))
                self._advancing[action.worker] = task
                task.add_done_callback(functools.partial(self._advanced, action.worker))
        return errors

    async def _gather(self, calls: Iterable[Awaitable[Any]]) -> list[Any]:
        """Run calls concurrently, at most PARALLEL_CALLS at a time; exceptions returned."""
        limit = asyncio.Semaphore(PARALLEL_CALLS)

        async def bounded(call: Awaitable[Any]) -> Any:
            async with limit:
                return await call

        return await asyncio.gather(*(bounded(c) for c in calls), return_exceptions=True)

    async def _bulk(
        self,
        items: list[tuple[str, T]],
        single: Callable[[str, T], Awaitable[R]],
        many: Callable[[str, list[tuple[str, T]]], Awaitable[Sequence[R | WorkerError]]],
    ) -> list[R | BaseException]:
        """One call per item for a worker on its own, one call per host for hosted
        ones; all concurrently. Results (or exceptions) in the order of `items`."""
        results: list[R | BaseException | None] = [None] * len(items)
        by_host: dict[str, list[int]] = {}
        alone = []
        for i, (w, _) in enumerate(items):
            host = self._host_of.get(w)
            if host is None:
                alone.append(i)
            else:
                by_host.setdefault(host, []).append(i)

        async def per_host(host: str, idx: list[int]) -> None:
            try:
                answers: Sequence[R | BaseException] = await many(host, [items[i] for i in idx])
            except Exception as e:  # the host is unreachable: every item failed
                answers = [e] * len(idx)
            for i, answer in zip(idx, answers, strict=True):
                results[i] = answer

        singles, *_ = await asyncio.gather(
            self._gather(single(*items[i]) for i in alone),
            *(per_host(h, idx) for h, idx in by_host.items()),
        )
        for i, answer in zip(alone, singles, strict=True):
            results[i] = answer
        return [r if r is not None else RuntimeError("no answer") for r in results]

    def _advanced(self, worker: str, task: asyncio.Task[None]) -> None:
        if self._advancing.get(worker) is task:  # not a later advance of a rejoined worker
            del self._advancing[worker]

    async def _advance(self, action: Advance, then: Callable[[], Awaitable[int]]) -> None:
        """Advance a worker; then make the placements its plan put after the advance
        (none if it failed: those trajectories stay parked and are planned again)."""
        try:
            info = self._versions.get(action.version)
            if info is None:  # a published version never changes: asked once
                info = self._versions[action.version] = await self.trainer.version(action.version)
            request = AdvanceRequest(
                version=action.version,
                weights_uri=self.trainer.weights_uri(info),
                sha256=info.sha256,
            )
            started = self.clock()
            await self._clients[action.worker].advance(request)
        except (WorkerError, TrainerError, OSError, httpx.TransportError) as e:
            self._totals["errors"] += 1
            log.warning("%s failed: %r", action, e)
            return
        self.advance_seconds.append(self.clock() - started)
        del self.advance_seconds[:-1000]
        try:
            self._totals["errors"] += await then()
        except (TrainerError, OSError, httpx.TransportError) as e:
            self._totals["errors"] += 1
            log.warning("placing after %s failed: %r", action, e)

    async def _place(
        self,
        places: Sequence[Place],
        view: LedgerView,
        pending: dict[str, PendingTrajectory],
        attempts: dict[str, int],
    ) -> int:
        """Record every placement under its attempt (one call), make them concurrently,
        and put back what a worker refused: fresh samples to the fresh pool (next
        attempt), departed ones to the worker they are parked on."""
        fresh = {f.id: f for f in view.fresh}
        requests, records = [], []
        unknown = [a for a in places if a.trajectory not in fresh and a.trajectory not in pending]
        for a in unknown:
            log.warning("%s names a sample that is neither fresh nor parked; skipped", a)
        self._refused.extend(unknown)
        places = [a for a in places if a not in unknown]
        for a in places:
            f = fresh.get(a.trajectory)
            if f is not None:
                budgets = self.config.budgets
                start = FreshStart(
                    prompt_token_ids=view.prompts[f.group],
                    sampling=Sampling(
                        temperature=view.temperature,
                        seed=_seed(f.id, f.attempt),
                        ignore_eos=budgets is not None,
                    ),
                    max_tokens=view.max_tokens
                    if budgets is None
                    else budgets.of(f.group, sample_index(f.id)),
                    max_tool_calls=self.config.max_tool_calls,
                )
                req = PlaceRequest(id=f.id, attempt=f.attempt, version=a.version, fresh=start)
            else:
                source = pending[a.trajectory].parked_on
                assert source is not None
                origin = Source(worker_id=source, url=self.workers[source])
                attempt = attempts.get(a.trajectory, 0) + 1
                req = PlaceRequest(
                    id=a.trajectory,
                    attempt=attempt,
                    version=a.version,
                    source=origin,
                    migration=self.config.knobs.migration,
                )
            requests.append(req)
            version = a.version if f is not None else None
            records.append(
                Record(
                    id=req.id, attempt=req.attempt, state="placed", worker=a.worker, version=version
                )
            )
        await self.trainer.record_many(records)
        results = await self._bulk(
            [(a.worker, r) for a, r in zip(places, requests, strict=True)],
            lambda w, r: self._clients[w].place(r, self.config.action_timeout_s),
            lambda host, items: self._hosts[host].place(items, self.config.action_timeout_s),
        )
        errors, back = 0, []
        failed: dict[tuple[str, str], list[str]] = {}
        for a, r, result in zip(places, requests, results, strict=True):
            if not isinstance(result, BaseException):
                continue
            errors += 1
            self._refused.append(a)
            failed.setdefault((a.worker, repr(result)), []).append(r.id)
            if r.fresh is not None:
                invalid = getattr(result, "status", None) == 422  # never startable anywhere
                await self.trainer.requeue(r.id, "sample" if invalid else "worker")
            elif r.source is not None:
                back.append(
                    Record(id=r.id, attempt=r.attempt, state="parked", worker=r.source.worker_id)
                )
        for (worker, why), ids in failed.items():  # one line per worker and cause
            shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
            log.warning("placing %s on %s failed: %s", shown, worker, why)
        await self.trainer.record_many(back)
        return errors + len(unknown)


def _seed(sid: str, attempt: int) -> int:
    """A sample's sampling seed: distinct per sample and attempt, the same on every
    worker, so a resumed trajectory samples as it would have in place."""
    return zlib.crc32(f"{sid}:{attempt}".encode())
