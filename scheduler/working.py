"""The mutable copy of the pool that one planning cycle works on.

A plan is a sequence of decisions, each of which changes what the next one sees (an
eviction raises headroom at once, a placement lowers it). `WorkingWorker` carries those
changes for the length of one `plan` call; the snapshot itself is never modified, and a
worker's resident list is copied only when the cycle first changes it.
"""

from __future__ import annotations

import math

# `_operator` is the C module behind the standard `operator` (see snapshot.py).
from _operator import le
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate, compress, repeat

from cadence.scheduler.cost import StepCost
from cadence.scheduler.snapshot import Knobs, Resident, WorkerView


class WorkingWorker:
    """One worker during a cycle: headroom, residents and its role.

    `residents` holds the snapshot's residents longest first, then this cycle's
    placements in the order they were made. Its floor and reserve are the knobs' values;
    where the knobs say auto and the worker's step cost is known, each is raised to what
    one control period of growth at its step rate needs (as observed at the start of the
    cycle): the floor to every resident's growth until the next cycle, so the engine does
    not run out of KV before the scheduler acts again, and the reserve to one period per
    resident. The knobs' values stay the least (see `thresholds` in the README).
    """

    __slots__ = (
        "_added",
        "_below",
        "_floor_each",
        "_h_min",
        "_owned",
        "_popped",
        "_residents",
        "accepting",
        "affinity",
        "capacity",
        "cost",
        "count",
        "id",
        "max_seqs",
        "reserve",
        "source",
        "used",
        "version",
        "view",
    )

    def __init__(self, view: WorkerView, knobs: Knobs) -> None:
        self.view = view
        self.id = view.id
        self.version = view.version
        self.affinity = view.affinity
        self.capacity = view.capacity
        self.used = view.used
        self.count = view.count  # how many it holds: the snapshot's, then this cycle's
        self.max_seqs = view.max_seqs
        self.cost: StepCost | None = view.cost
        # The snapshot's residents until this cycle first reads them (a presorted view
        # builds them on that read); its own list once it changes them.
        self._residents: list[Resident] | tuple[Resident, ...] | None = None
        self._owned = False
        # Placements made before the list is first read or changed otherwise: a worker
        # that only receives work this cycle never copies the snapshot's residents.
        self._added: list[Resident] = []
        self._popped: list[int] = []  # contexts of evictable residents popped this cycle
        self._below: tuple[int, int, Sequence[int], Sequence[int]] | None = None
        self.source = False
        # Accepting: may receive placements this cycle (not draining, not advancing,
        # not a concentration source, holds weights).
        self.accepting = not view.draining and view.version is not None
        growth = period_growth(view, knobs.control_period_s)
        self._h_min = knobs.h_min
        self._floor_each = growth if knobs.auto_h_min and growth is not None else None
        self.reserve = knobs.delta
        if knobs.auto_delta and growth is not None:
            self.reserve = max(knobs.delta, growth)

    def floor(self, count: int | None = None) -> int:
        """The headroom floor with `count` residents (default: as many as it holds now)."""
        if self._floor_each is None:
            return self._h_min
        return max(self._h_min, self._floor_each * (self.count if count is None else count))

    def margin(self) -> int:
        """Headroom above the floor it would have with one more resident (the
        concentration rule's room; one call, as it is read for every candidate)."""
        each = self._floor_each
        floor = self._h_min if each is None else max(self._h_min, each * (self.count + 1))
        return self.capacity - self.used - floor

    def can_take(self, context: int) -> bool:
        """`pacing.placement_feasible`: a seat, and headroom after placing `context` at
        or above the floor plus the reserve for every resident, the new one included.
        Written out here: the fit rule asks it of every candidate worker."""
        n = self.count + 1
        if self.max_seqs is not None and n > self.max_seqs:
            return False
        each = self._floor_each
        floor = self._h_min if each is None or each * n < self._h_min else each * n
        return self.capacity - self.used - context >= floor + self.reserve * n

    def has_seat(self) -> bool:
        """Below the engine's sequence limit: one more trajectory would decode at once."""
        return self.max_seqs is None or self.count < self.max_seqs

    def saturated_with(self, context: int) -> bool:
        """Would one more trajectory of `context` take its step past twice an empty one?"""
        cost = self.cost
        return cost is not None and cost.saturated(self.count + 1, self.used + context)

    @property
    def headroom(self) -> int:
        return self.capacity - self.used

    @property
    def residents(self) -> list[Resident] | tuple[Resident, ...]:
        if self._added:
            return self._own()
        if self._residents is None:
            self._residents = self.view.residents
        return self._residents

    def _own(self) -> list[Resident]:
        if not self._owned:
            base = self.view.residents if self._residents is None else self._residents
            self._residents = [*base, *self._added]
            self._added = []
            self._owned = True
        assert isinstance(self._residents, list)
        return self._residents

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

    def evictable_below(
        self, context: int, min_decode: int
    ) -> tuple[Sequence[int], Sequence[int], int]:
        """The residents the concentration rule may displace for a trajectory of
        `context`: those shorter than it and past the anti-thrash minimum. Returned as
        (contexts ascending, their running sums from 0, k): the first k contexts are
        those residents (the list may run on past them) and the k-th sum their KV.

        Read from the snapshot's arrays, less what this cycle has popped; a resident
        `add`ed this cycle has decoded nothing, so it never qualifies.
        """
        found, sums = self._evictable(context, min_decode)
        return found, sums, bisect_left(found, context)

    def freeable_below(self, context: int, min_decode: int) -> int:
        """KV freed by evicting every evictable resident shorter than `context`."""
        _, sums, k = self.evictable_below(context, min_decode)
        return sums[k]

    def _evictable(self, context: int, min_decode: int) -> tuple[Sequence[int], Sequence[int]]:
        """The evictable contexts ascending, covering every one below `context`, and
        their running sums from 0 (one more entry)."""
        cached = self._below
        if cached is not None and context <= cached[0] and cached[1] == len(self._popped):
            return cached[2], cached[3]
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
        sums = tuple(accumulate(found, initial=0))
        # Callers ask for ever shorter bounds as they walk P_v down: keep the widest.
        self._below = (context, len(self._popped), found, sums)
        return found, sums

    def longest_first_within(self, most: int, min_decode: int) -> Iterator[Resident]:
        """Its evictable residents of at most `most` tokens, longest first, as of now
        (a snapshot of the list: the caller may move some as it goes)."""
        residents = tuple(self.residents)
        start = 0
        if not self._owned:  # still the snapshot's order: skip the longer ones at once
            start = len(residents) - bisect_right(self.view.contexts_ascending, most)
        for r in residents[start:]:
            if r.context <= most and r.decoded_since_placement >= min_decode:
                yield r

    def evictable_kv(self, min_decode: int) -> int:
        """KV held by the residents past the anti-thrash minimum: what displacing could
        free at most."""
        view = self.view
        if view.least_decoded >= min_decode:
            total = view.used
        else:
            old_enough = map(le, repeat(min_decode), view.decoded_ascending)
            total = sum(compress(view.contexts_ascending, old_enough))
        return total - sum(self._popped)

    def pop(self, index: int, min_decode: int) -> Resident:
        resident = self._own().pop(index)
        self.used -= resident.context
        self.count -= 1
        if resident.decoded_since_placement >= min_decode:
            self._popped.append(resident.context)
        return resident

    def add(self, trajectory: str, context: int) -> None:
        """Place a trajectory here. It goes last: it is inside the anti-thrash window for
        the rest of the cycle, so no rule looks for it by length."""
        resident = Resident(trajectory, context, 0)
        if self._owned:
            assert isinstance(self._residents, list)
            self._residents.append(resident)
        else:
            self._added.append(resident)
        self.used += context
        self.count += 1


def period_growth(view: WorkerView, period_s: float) -> int | None:
    """Tokens each resident grows in one control period at the worker's current step
    rate (at least one); None when its step cost is unknown."""
    if view.cost is None:
        return None
    step = view.cost.step_s(view.count, view.used)
    return max(1, math.ceil(period_s / step)) if step > 0.0 else None
