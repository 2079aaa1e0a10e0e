"""The control loop's copy of the trainer's ledger, kept current by its changes.

The loop needs every fresh and in-flight sample each period, tens of thousands on a
large pool, while only the few hundred placed, moved or delivered since the last period
change. So it reads the ledger whole once and then only what changed after the last
answer (`GET /v1/ledger?since=`, `LedgerView.delta`), and applies that to what it keeps.
The trainer answers whole when it cannot answer with changes (another ledger, a ledger
behind the copy), and the copy then starts over from that answer; so a trainer that
restarts on its ledger costs nothing, and one that starts a new ledger costs one full
read. Nothing here is needed across a restart of the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cadence.scheduler.fresh_index import FreshIndex
from cadence.scheduler.snapshot import FreshSample
from cadence.trainer.api import FreshView, InFlight, LedgerView
from cadence.trainer.client import TrainerClient


@dataclass
class LedgerCopy:
    trainer: TrainerClient
    _last: LedgerView | None = None
    # The fresh and in-flight samples by id, and the fresh ones as the scheduler's
    # snapshot takes them (`FreshIndex`), as of the last read.
    fresh: dict[str, FreshView] = field(default_factory=dict)
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    index: FreshIndex = field(default_factory=lambda: FreshIndex(1))
    _prompts: dict[int, list[int]] = field(default_factory=dict)

    async def read(self) -> LedgerView:
        """The ledger now, as a whole `LedgerView` (`delta` false), read as changes
        after the last read where the trainer can."""
        answer = await self.trainer.ledger(None if self._last is None else self._last.since)
        return self.apply(answer)

    def apply(self, answer: LedgerView) -> LedgerView:
        if not answer.delta:
            self.fresh = {f.id: f for f in answer.fresh}
            self.in_flight = {s.id: s for s in answer.in_flight}
            self._prompts = dict(answer.prompts)
            self.index = FreshIndex.of(answer.batch_groups, (self._sample(f) for f in answer.fresh))
            self._last = answer
            return answer
        # A group's prompt is kept while any of its samples is fresh (placed from it).
        prompts = self._prompts | answer.prompts
        for sid in [f.id for f in answer.fresh] + [s.id for s in answer.in_flight] + answer.ended:
            self.in_flight.pop(sid, None)
            if self.fresh.pop(sid, None) is not None:
                self.index.take(sid)
        for s in answer.in_flight:
            self.in_flight[s.id] = s
        for f in answer.fresh:
            self.fresh[f.id] = f
        self._prompts = {g: prompts[g] for g in {f.group for f in self.fresh.values()}}
        for f in answer.fresh:
            self.index.add(self._sample(f))
        # Built from validated parts, so not validated again (a whole pool's samples).
        view = answer.model_copy(
            update={
                "fresh": list(self.fresh.values()),
                "in_flight": list(self.in_flight.values()),
                "prompts": self._prompts,
                "ended": [],
                "delta": False,
            }
        )
        self._last = view
        return view

    def _sample(self, f: FreshView) -> FreshSample:
        return FreshSample(f.id, f.group, len(self._prompts[f.group]))
