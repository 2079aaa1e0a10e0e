"""The control loop's side of a run trace (`common/trace.py`): it sees every worker and
every action, so it records the workers' decode steps and the plans it applied as they
happen, and reads the trajectories the trainer accepted, and its updates, every few
seconds (`GET /v1/ended`, `GET /v1/stats`). The loop calls it once a cycle; a cycle that
cannot reach the trainer leaves the trajectories for the next read, so none is lost.
A trace that cannot be written (a full disk) stops the trace, said once in the log, and
never the loop: scheduling goes on without it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cadence.common.trace import (
    Action,
    Header,
    Record,
    Steps,
    Summary,
    Trajectory,
    TurnSize,
    Update,
    Writer,
)
from cadence.operator.control.events import events_of
from cadence.scheduler.actions import Action as PlanAction
from cadence.scheduler.snapshot import Snapshot
from cadence.trainer.api import Ended
from cadence.trainer.client import TrainerClient
from cadence.worker.api import DecodeSteps, WorkerState

log = logging.getLogger("cadence.loop")

READ_EVERY_S = 2.0  # how often the trainer is asked what it accepted


@dataclass
class TraceRecorder:
    path: Path
    header: Header
    trainer: TrainerClient
    clock: Callable[[], float]
    read_every_s: float = READ_EVERY_S
    _writer: Writer | None = None
    _origin: float = 0.0
    _last_steps: dict[str, DecodeSteps] = field(default_factory=dict)
    _after: int = -1  # the last accepted delivery recorded
    _versions: set[int] = field(default_factory=set)
    _read_at: float | None = None
    stopped: str | None = None  # why the trace stopped before the run ended, if it did

    def open(self) -> None:
        self._writer = Writer(self.path, self.header)
        self._origin = self.clock()

    def _at(self) -> float:
        return max(0.0, self.clock() - self._origin)

    def observed(self, states: Mapping[str, WorkerState]) -> None:
        """Each worker's decode steps since it was last observed, as one sample."""
        if self._writer is None:
            return
        at, out = self._at(), []
        for wid, st in states.items():
            now = st.decode_steps
            if now is None:
                continue
            before = self._last_steps.get(wid)
            self._last_steps[wid] = now
            if before is None or now.steps < before.steps:  # new, or its engine restarted
                continue
            if now.steps > before.steps:
                out.append(
                    Steps(
                        at=at,
                        worker=wid,
                        accelerator=st.accelerator,
                        steps=now.steps - before.steps,
                        seconds=max(0.0, now.seconds - before.seconds),
                        sequences=max(0, now.sequences - before.sequences),
                        context_tokens=max(0, now.context_tokens - before.context_tokens),
                    )
                )
        self._write(*out)

    def applied(self, snapshot: Snapshot, actions: Sequence[PlanAction]) -> None:
        if self._writer is None:
            return
        at = self._at()
        self._write(
            *(
                Action(
                    at=at, action=e.kind, worker=e.worker, trajectory=e.trajectory, detail=e.detail
                )
                for e in events_of(snapshot, actions, at)
            )
        )

    async def read_trainer(self, *, now: bool = False) -> None:
        """Record what the trainer accepted and published since the last read, at most
        every `read_every_s` unless `now`."""
        t = self.clock()
        if self._writer is None:
            return
        if not now and self._read_at is not None and t - self._read_at < self.read_every_s:
            return
        self._read_at = t  # a read that fails is tried again a period later, not each cycle
        while True:
            page = await self.trainer.ended(self._after)
            at = self._at()
            self._write(*(_trajectory(e, at) for e in page.items))
            self._after = page.last
            if not page.items:
                break
        stats = await self.trainer.stats()
        fresh = sorted(v for v in stats.update_seconds if v not in self._versions)
        self._write(
            *(Update(at=self._at(), version=v, seconds=stats.update_seconds[v]) for v in fresh)
        )
        self._versions.update(fresh)

    def close(self, summary: Summary | None = None) -> None:
        if summary is not None:
            self._write(summary)
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _write(self, *records: Record) -> None:
        if self._writer is None:
            return
        try:
            self._writer.write(*records)
        except OSError as e:
            log.warning("the trace %s stops here: %s", self.path, e)
            self.stopped = f"it could not be written after {self._at():.0f} s: {e}"
            with contextlib.suppress(OSError):
                self._writer.close()
            self._writer = None


def _trajectory(e: Ended, at: float) -> Trajectory:
    return Trajectory(
        at=at,
        id=e.id,
        batch=e.batch,
        group=e.group,
        worker=e.worker,
        prompt_tokens=e.prompt_tokens,
        turns=[
            TurnSize(role=t.role, tokens=t.tokens, version=t.version, seconds=t.seconds)
            for t in e.turns
        ],
        failed=e.failed,
        latency_s=e.latency_s,
    )
