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

from cadence.trainer.api import FreshView, InFlight, LedgerView
from cadence.trainer.client import TrainerClient


@dataclass
class LedgerCopy:
    trainer: TrainerClient
    _last: LedgerView | None = None
    _fresh: dict[str, FreshView] = field(default_factory=dict)
    _in_flight: dict[str, InFlight] = field(default_factory=dict)
    _prompts: dict[int, list[int]] = field(default_factory=dict)

    async def read(self) -> LedgerView:
        """The ledger now, as a whole `LedgerView` (`delta` false), read as changes
        after the last read where the trainer can."""
        answer = await self.trainer.ledger(None if self._last is None else self._last.since)
        return self.apply(answer)

    def apply(self, answer: LedgerView) -> LedgerView:
        if not answer.delta:
            self._fresh = {f.id: f for f in answer.fresh}
            self._in_flight = {s.id: s for s in answer.in_flight}
            self._prompts = dict(answer.prompts)
            self._last = answer
            return answer
        for f in answer.fresh:
            self._in_flight.pop(f.id, None)
            self._fresh[f.id] = f
        for s in answer.in_flight:
            self._fresh.pop(s.id, None)
            self._in_flight[s.id] = s
        for sid in answer.ended:
            self._fresh.pop(sid, None)
            self._in_flight.pop(sid, None)
        # A group's prompt is kept while any of its samples is fresh (placed from it).
        prompts = self._prompts | answer.prompts
        self._prompts = {g: prompts[g] for g in {f.group for f in self._fresh.values()}}
        # Built from validated parts, so not validated again (a whole pool's samples).
        view = answer.model_copy(
            update={
                "fresh": list(self._fresh.values()),
                "in_flight": list(self._in_flight.values()),
                "prompts": self._prompts,
                "ended": [],
                "delta": False,
            }
        )
        self._last = view
        return view
