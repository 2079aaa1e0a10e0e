"""The mutable copy of the pool that one planning cycle works on.

A plan is a sequence of decisions, each of which changes what the next one sees (an
eviction raises headroom at once, a placement lowers it). `WorkingWorker` carries those
changes for the length of one `plan` call; the snapshot itself is never modified, and a
worker's resident list is copied only when the cycle first changes it.
"""

from __future__ import annotations

from bisect import insort

from cadence.operator.scheduler.snapshot import Resident, WorkerView


def _longest_first(r: Resident) -> tuple[int, str]:
    return (-r.context, r.id)


class WorkingWorker:
    """One worker during a cycle: headroom, residents (longest first) and its role."""

    __slots__ = (
        "_owned",
        "accepting",
        "affinity",
        "capacity",
        "id",
        "residents",
        "source",
        "used",
        "version",
        "view",
    )

    def __init__(self, view: WorkerView) -> None:
        self.view = view
        self.id = view.id
        self.version = view.version
        self.affinity = view.affinity
        self.capacity = view.capacity
        self.used = view.used
        self.residents: list[Resident] | tuple[Resident, ...] = view.residents
        self._owned = False
        self.source = False
        # Accepting: may receive placements this cycle (not draining, not advancing,
        # not a concentration source, holds weights).
        self.accepting = not view.draining and view.version is not None

    @property
    def headroom(self) -> int:
        return self.capacity - self.used

    @property
    def count(self) -> int:
        return len(self.residents)

    def _own(self) -> list[Resident]:
        if not self._owned:
            self.residents = list(self.residents)
            self._owned = True
        assert isinstance(self.residents, list)
        return self.residents

    def longest_evictable(self, min_decode: int) -> Resident | None:
        """The longest resident that has decoded the anti-thrash minimum since placement."""
        for r in self.residents:
            if r.decoded_since_placement >= min_decode:
                return r
        return None

    def shortest_evictable(self, min_decode: int) -> Resident | None:
        """The shortest resident that has decoded the anti-thrash minimum since placement."""
        for r in reversed(self.residents):
            if r.decoded_since_placement >= min_decode:
                return r
        return None

    def remove(self, resident: Resident) -> None:
        self._own().remove(resident)
        self.used -= resident.context

    def add(self, trajectory: str, context: int) -> None:
        insort(self._own(), Resident(trajectory, context, 0), key=_longest_first)
        self.used += context
