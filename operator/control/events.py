"""What a plan did, as events: each action the loop applied, with what it meant for its
trajectory (a fresh start, a resume where it was parked, a move from another worker).
The run's report and the trace both read plans this way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

from cadence.scheduler.actions import Action, Advance, Evict, Place
from cadence.scheduler.snapshot import Snapshot


class Event(NamedTuple):
    """One action a plan applied. `detail` is an eviction's reason, and for a placement
    `fresh` (a new sample), `resume` (back where it was parked) or `move` (from another
    worker)."""

    at: float  # seconds since the run started
    kind: Literal["evict", "place", "advance"]
    worker: str
    trajectory: str  # "" for an advance
    detail: str


def events_of(snapshot: Snapshot, actions: Sequence[Action], at: float) -> list[Event]:
    """The events of one plan, in the order it was applied."""
    parked = {p.id: p.parked_on for p in snapshot.pending}
    out = []
    for a in actions:
        if isinstance(a, Evict):
            out.append(Event(at, "evict", a.worker, a.trajectory, str(a.reason)))
            parked[a.trajectory] = a.worker
        elif isinstance(a, Place):
            if a.trajectory not in parked:
                detail = "fresh"
            elif parked[a.trajectory] in (None, a.worker):
                detail = "resume"
            else:
                detail = "move"
            out.append(Event(at, "place", a.worker, a.trajectory, detail))
        elif isinstance(a, Advance):
            out.append(Event(at, "advance", a.worker, "", str(a.version)))
    return out
