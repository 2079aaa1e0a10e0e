"""Pending trajectories kept ordered as they come and go, for `Snapshot(pending_index=...)`.

A snapshot groups P_v by version, shortest first, and keeps the placeable ones and their
contexts apart: built from scratch, that is a sort of every pending trajectory every
period. An observer that sees trajectories depart, return from their environment and be
placed (the simulator) keeps them sorted here instead, and a version whose P_v did not
change shows the same tuples as the period before.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from typing import NamedTuple

from cadence.scheduler.snapshot import PENDING_ORDER, PendingOrder, PendingTrajectory


class _Shown(NamedTuple):
    every: tuple[PendingTrajectory, ...]
    placeable: tuple[PendingTrajectory, ...]
    contexts: tuple[int, ...]


class PendingIndex:
    def __init__(self) -> None:
        self._items: dict[str, PendingTrajectory] = {}  # by id, in the order they came
        self._sorted: dict[int, list[PendingTrajectory]] = {}
        self._shown: dict[int, _Shown | None] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, tid: object) -> bool:
        return tid in self._items

    def __iter__(self) -> Iterator[PendingTrajectory]:
        return iter(self._items.values())

    def put(self, p: PendingTrajectory) -> None:
        """Add `p`, or replace the trajectory of its id (it returned from a tool call),
        which keeps its place in the order they came."""
        old = self._items.get(p.id)
        if old is not None:
            self._unsort(old)
        self._items[p.id] = p
        insort(self._sorted.setdefault(p.version, []), p, key=PENDING_ORDER)
        self._shown[p.version] = None

    def take(self, tid: str) -> PendingTrajectory:
        p = self._items.pop(tid)
        self._unsort(p)
        return p

    def _unsort(self, p: PendingTrajectory) -> None:
        ps = self._sorted[p.version]
        del ps[bisect_left(ps, PENDING_ORDER(p), key=PENDING_ORDER)]
        if ps:
            self._shown[p.version] = None
        else:
            del self._sorted[p.version], self._shown[p.version]

    def order(self) -> PendingOrder:
        """What `Snapshot` derives from its pending trajectories, as of now."""
        shown = self._shown
        for v, ps in self._sorted.items():
            if shown[v] is None:
                every = tuple(ps)
                placeable = tuple(p for p in every if p.placeable)
                shown[v] = _Shown(every, placeable, tuple(p.context for p in placeable))
        every_by_v, placeable_by_v, contexts_by_v = {}, {}, {}
        for v in sorted(shown):
            s = shown[v]
            assert s is not None
            every_by_v[v], placeable_by_v[v], contexts_by_v[v] = s
        return PendingOrder(every_by_v, placeable_by_v, contexts_by_v)
