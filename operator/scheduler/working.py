"""The mutable copy of the pool that one planning cycle works on.

A plan is a sequence of decisions, each of which changes what the next one sees (an
eviction raises headroom at once, a placement lowers it). `WorkingWorker` carries those
changes for the length of one `plan` call; the snapshot itself is never modified, and a
worker's resident list is copied only when the cycle first changes it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from cadence.operator.scheduler.snapshot import Resident, WorkerView


class WorkingWorker:
    """One worker during a cycle: headroom, residents and its role.

    `residents` holds the snapshot's residents longest first, then this cycle's
    placements in the order they were made.
    """

    __slots__ = (
        "_below",
        "_owned",
        "_popped",
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
        self._popped: list[int] = []  # contexts of evictable residents popped this cycle
        self._below: tuple[int, int, Sequence[int]] | None = None
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

    def longest_evictable(self, min_decode: int) -> int | None:
        """Index of the longest resident past the anti-thrash minimum since placement."""
        for i, r in enumerate(self.residents):
            if r.decoded_since_placement >= min_decode:
                return i
        return None

    def shortest_evictable(self, min_decode: int) -> int | None:
        """Index of the shortest resident past the anti-thrash minimum since placement."""
        residents = self.residents
        for i in range(len(residents) - 1, -1, -1):
            if residents[i].decoded_since_placement >= min_decode:
                return i
        return None

    def evictable_below(self, context: int, min_decode: int) -> Sequence[int]:
        """Contexts (ascending) of the residents shorter than `context` that are past the
        anti-thrash minimum: the ones the concentration rule may displace for it.

        Read from the snapshot's arrays, less what this cycle has popped; a resident
        `add`ed this cycle has decoded nothing, so it never qualifies.
        """
        cached = self._below
        if cached is not None and context <= cached[0] and cached[1] == len(self._popped):
            shorter = cached[2]
            return shorter[: bisect_left(shorter, context)]
        view = self.view
        k = bisect_left(view.contexts_ascending, context)
        found: Sequence[int]
        if view.least_decoded >= min_decode:
            found = view.contexts_ascending[:k]
        else:
            pairs = zip(view.contexts_ascending[:k], view.decoded_ascending[:k], strict=True)
            found = [c for c, d in pairs if d >= min_decode]
        popped = [c for c in self._popped if c < context]
        if popped:
            remaining = list(found)
            for c in popped:
                del remaining[bisect_left(remaining, c)]
            found = remaining
        # Callers ask for ever shorter bounds as they walk P_v down: keep the widest.
        self._below = (context, len(self._popped), found)
        return found

    def freeable_below(self, context: int, min_decode: int) -> int:
        """KV freed by evicting every evictable resident shorter than `context`."""
        return sum(self.evictable_below(context, min_decode))

    def pop(self, index: int, min_decode: int) -> Resident:
        resident = self._own().pop(index)
        self.used -= resident.context
        if resident.decoded_since_placement >= min_decode:
            self._popped.append(resident.context)
        return resident

    def add(self, trajectory: str, context: int) -> None:
        """Place a trajectory here. It goes last: it is inside the anti-thrash window for
        the rest of the cycle, so no rule looks for it by length."""
        self._own().append(Resident(trajectory, context, 0))
        self.used += context
