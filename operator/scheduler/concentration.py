"""Concentration: once a version's short end is exhausted, drain its tail onto the workers
best suited to long contexts, one departure-only source at a time.

The source departs its residents longest first, but only while P_v holds nothing
placeable: the pending set is the pace governor, so displacement never outruns what the
targets absorb. Targets take pending work longest first, in order of affinity rank and
then headroom margin, under the floor alone (these trajectories are near the end of their
lives, so no decode reserve), and may make room only by departing residents shorter than
the trajectory they take in. An emptied source advances to a newer version, where fresh
short work restores the conditions for pacing.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from cadence.operator.scheduler.actions import Action, Evict, EvictReason, Place
from cadence.operator.scheduler.snapshot import PendingTrajectory, Resident
from cadence.operator.scheduler.working import WorkingWorker


def select_source(candidates: Sequence[WorkingWorker]) -> WorkingWorker | None:
    """Source rule: among one version's workers, the weakest affinity that has residents.

    Ties go to the fewest resident tokens (cheapest to empty), then the worker id. A
    source is chosen only if another worker of the version remains to host its tail.
    """
    if len(candidates) < 2:
        return None
    with_residents = [w for w in candidates if w.count > 0]
    if not with_residents:
        return None
    return min(with_residents, key=lambda w: (w.affinity, w.used, w.id))


def evict_shortest_to_floor(
    worker: WorkingWorker, h_min: int, min_decode: int, out: list[Action]
) -> None:
    """Floor rule (concentration target): while H_w < h_min, depart the shortest resident.

    A target is where the long tail is being gathered, so it keeps its long residents and
    sheds short ones, which find room elsewhere more easily.
    """
    while worker.headroom < h_min:
        victim = worker.shortest_evictable(min_decode)
        if victim is None:
            return
        worker.remove(victim)
        out.append(Evict(victim.id, worker.id, victim.context, EvictReason.FLOOR))


def _room_by_shorter(
    worker: WorkingWorker, context: int, h_min: int, min_decode: int
) -> list[Resident] | None:
    """The shortest evictable residents, each shorter than `context`, that make it fit.

    None when even all of them would not free enough: then nothing is evicted there.
    """
    need = context + h_min - worker.headroom
    chosen: list[Resident] = []
    freed = 0
    for r in reversed(worker.residents):
        if freed >= need:
            break
        if r.context >= context:
            break
        if r.decoded_since_placement >= min_decode:
            chosen.append(r)
            freed += r.context
    return chosen if freed >= need else None


class TargetIndex:
    """The targets of one version: by affinity rank descending, then headroom descending.

    Within an affinity class the worker with the most headroom is the first the rule
    would try, so each class keeps a max-heap by headroom and a trajectory looks at one
    worker per class: O(classes * log W) per placement.
    """

    __slots__ = ("_classes",)

    def __init__(self, targets: Sequence[WorkingWorker]) -> None:
        by_rank: dict[int, list[tuple[int, str, WorkingWorker]]] = {}
        for w in targets:
            by_rank.setdefault(w.affinity, []).append((-w.headroom, w.id, w))
        self._classes = [by_rank[rank] for rank in sorted(by_rank, reverse=True)]
        for heap in self._classes:
            heapq.heapify(heap)

    def place(
        self,
        trajectory: str,
        *,
        context: int,
        h_min: int,
        min_decode: int,
        out: list[Action],
    ) -> tuple[bool, int]:
        """Placement rule (concentration): the first target in order that fits or can make
        room by departing residents shorter than the incoming trajectory; threshold h_min.

        Returns whether it was placed and how many residents it displaced.
        """
        for heap in self._classes:
            worker = heap[0][2]
            if worker.headroom - context >= h_min:
                victims: list[Resident] = []
            else:
                found = _room_by_shorter(worker, context, h_min, min_decode)
                if found is None:
                    continue
                victims = found
            for r in victims:
                worker.remove(r)
                out.append(Evict(r.id, worker.id, r.context, EvictReason.MAKE_ROOM))
            worker.add(trajectory, context)
            assert worker.version is not None
            out.append(Place(trajectory, worker.id, worker.version, context))
            heapq.heapreplace(heap, (-worker.headroom, worker.id, worker))
            return True, len(victims)
        return False, 0


def concentrate(
    source: WorkingWorker | None,
    targets: Sequence[WorkingWorker],
    pending: Sequence[PendingTrajectory],
    *,
    h_min: int,
    min_decode: int,
    out: list[Action],
) -> None:
    """One cycle of concentration for one version.

    Pending trajectories (`pending` in ascending context, this cycle's floor departures
    included) go longest first onto the targets. Then, backpressure: the source departs
    its next longest resident only while P_v holds no placeable trajectory, and each
    departure is offered to the targets at once; the first one they cannot absorb stays
    in P_v and stops the source for this cycle.
    """
    index = TargetIndex(targets)
    blocked = False
    for p in reversed(pending):
        if not p.placeable:
            continue
        placed, displaced = index.place(
            p.id, context=p.context, h_min=h_min, min_decode=min_decode, out=out
        )
        # Residents displaced by targets wait in P_v for a later pass: they hold the source.
        blocked = blocked or not placed or displaced > 0
    if source is None:
        return
    while not blocked:
        victim = source.longest_evictable(min_decode)
        if victim is None:
            return
        source.remove(victim)
        out.append(Evict(victim.id, source.id, victim.context, EvictReason.SOURCE))
        placed, displaced = index.place(
            victim.id, context=victim.context, h_min=h_min, min_decode=min_decode, out=out
        )
        blocked = not placed or displaced > 0
