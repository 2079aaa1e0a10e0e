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
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from cadence.operator.scheduler.actions import Action, Evict, EvictReason, Place
from cadence.operator.scheduler.snapshot import PendingTrajectory
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
        index = worker.shortest_evictable(min_decode)
        if index is None:
            return
        victim = worker.pop(index, min_decode)
        out.append(Evict(victim.id, worker.id, victim.context, EvictReason.FLOOR))


class TargetIndex:
    """The targets of one version: by affinity rank descending, then headroom descending.

    Within an affinity class the worker with the most headroom is the first the rule
    would try, so each class keeps a max-heap by headroom and a trajectory is offered to
    one worker per class: the class's top.

    Pending trajectories come longest first and most of them, in a backed-up P_v, fit
    nowhere. `next_fit` finds the next one a class top can take by bisecting over the
    pending contexts instead of trying each in turn: with the top's evictable residents
    sorted e_0 <= e_1 <= ..., a trajectory of context c in (e_{k-1}, e_k] fits iff
    c <= H - h_min + (e_0 + ... + e_{k-1}), so each segment is one range query.
    """

    __slots__ = ("_classes", "h_min", "min_decode")

    def __init__(self, targets: Sequence[WorkingWorker], h_min: int, min_decode: int) -> None:
        self.h_min = h_min
        self.min_decode = min_decode
        by_rank: dict[int, list[tuple[int, str, WorkingWorker]]] = {}
        for w in targets:
            by_rank.setdefault(w.affinity, []).append((-w.headroom, w.id, w))
        self._classes = [by_rank[rank] for rank in sorted(by_rank, reverse=True)]
        for heap in self._classes:
            heapq.heapify(heap)

    def __len__(self) -> int:
        return len(self._classes)

    def fits(self, k: int, context: int) -> bool:
        """Can class k's top take `context`, evicting only residents shorter than it?"""
        w = self._classes[k][0][2]
        return w.headroom + w.freeable_below(context, self.min_decode) - context >= self.h_min

    def next_fit(self, k: int, contexts: Sequence[int], hi: int) -> int:
        """The largest j < hi such that class k's top can take a trajectory of
        `contexts[j]` (ascending); -1 if none."""
        if hi <= 0:
            return -1
        w = self._classes[k][0][2]
        budget = w.capacity - w.used - self.h_min
        cmax = contexts[hi - 1]
        if cmax <= budget:
            return hi - 1  # the longest left fits without displacing anyone
        shorter = w.evictable_below(cmax, self.min_decode)
        seg = len(shorter)
        freed = sum(shorter)  # evicting every resident shorter than cmax
        # Segment seg holds contexts c in (shorter[seg-1], shorter[seg]]; there c fits
        # iff c <= budget + (sum of the seg shortest), found by one range query. The
        # slack budget + freed - lower only shrinks going down, so once a segment is
        # empty every shorter one is too.
        while seg >= 0:
            lower = shorter[seg - 1] if seg > 0 else 0
            upper = budget + freed
            if upper <= lower:
                return -1
            upper = min(upper, cmax)
            if seg < len(shorter) and shorter[seg] < upper:
                upper = shorter[seg]
            if upper > lower:
                j = bisect_right(contexts, upper, 0, hi) - 1
                if j >= 0 and contexts[j] > lower:
                    return j
            cmax = lower
            seg -= 1
            freed -= lower
        return -1

    def place_on(self, k: int, trajectory: str, context: int, out: list[Action]) -> int:
        """Placement rule (concentration): put the trajectory on class k's top, first
        departing its shortest evictable residents shorter than it if the floor needs it.
        Returns how many residents it displaced."""
        heap = self._classes[k]
        worker = heap[0][2]
        need = context + self.h_min - worker.headroom
        victims: list[int] = []
        i = len(worker.residents) - 1
        while need > 0 and i >= 0:
            r = worker.residents[i]
            if r.decoded_since_placement >= self.min_decode:
                if r.context >= context:
                    break
                victims.append(i)
                need -= r.context
            i -= 1
        assert need <= 0, "place_on called for a trajectory the target cannot take"
        for index in victims:  # descending indices: each pop leaves the rest in place
            r = worker.pop(index, self.min_decode)
            out.append(Evict(r.id, worker.id, r.context, EvictReason.MAKE_ROOM))
        worker.add(trajectory, context)
        assert worker.version is not None
        out.append(Place(trajectory, worker.id, worker.version, context))
        heapq.heapreplace(heap, (-worker.headroom, worker.id, worker))
        return len(victims)


Stream = tuple[Sequence[PendingTrajectory], Sequence[int]]
"""Placeable pending trajectories ascending by (context, id), and their contexts."""

_Pick = tuple[tuple[int, str], int, int]  # ((context, id), stream, position)


def _count_below(stream: Stream, key: tuple[int, str], hi: int) -> int:
    """How many of the stream's first `hi` items order before `key`."""
    items, contexts = stream
    i = bisect_left(contexts, key[0], 0, hi)
    while i < hi and contexts[i] == key[0] and items[i].id < key[1]:
        i += 1
    return i


def concentrate(
    source: WorkingWorker | None,
    targets: Sequence[WorkingWorker],
    streams: Sequence[Stream],
    *,
    h_min: int,
    min_decode: int,
    out: list[Action],
) -> None:
    """One cycle of concentration for one version.

    Placeable pending trajectories (P_v as observed, and this cycle's floor departures,
    each an ascending `Stream`) go longest first onto the targets: each to the first
    class top, in affinity order, that can take it. Then, backpressure: the source
    departs its next longest resident only while P_v holds no placeable trajectory, and
    each departure is offered to the targets at once; the first one they cannot absorb
    stays in P_v and stops the source for this cycle.
    """
    index = TargetIndex(targets, h_min, min_decode)
    his = [len(items) for items, _ in streams]

    def best_for(k: int) -> _Pick | None:
        """The longest remaining candidate class k's top can take, over all streams.

        Streams are searched from the one whose longest remaining candidate is longest; a
        stream whose longest cannot beat the pick so far is not searched at all.
        """
        order = [n for n in range(len(streams)) if his[n]]
        order.sort(key=lambda n: streams[n][1][his[n] - 1], reverse=True)
        best: _Pick | None = None
        for n in order:
            items, contexts = streams[n]
            if best is not None and contexts[his[n] - 1] < best[0][0]:
                break
            j = index.next_fit(k, contexts, his[n])
            if j >= 0 and (best is None or (contexts[j], items[j].id) > best[0]):
                best = ((contexts[j], items[j].id), n, j)
        return best

    bests = [best_for(k) for k in range(len(index))]
    placed = displaced = 0
    while True:
        chosen: tuple[int, _Pick] | None = None
        for c, pick in enumerate(bests):  # ties go to the higher affinity class
            if pick is not None and (chosen is None or pick[0] > chosen[1][0]):
                chosen = (c, pick)
        if chosen is None:
            break
        k, (key, n, j) = chosen
        displaced += index.place_on(k, key[1], key[0], out)
        placed += 1
        his = [j if m == n else _count_below(st, key, his[m]) for m, st in enumerate(streams)]
        for c, pick in enumerate(bests):
            if c == k or (pick is not None and pick[0] >= key):
                bests[c] = best_for(c)
    # Residents displaced by targets wait in P_v for a later pass: they hold the source.
    blocked = placed < sum(len(items) for items, _ in streams) or displaced > 0
    if source is None:
        return
    while not blocked:
        at = source.longest_evictable(min_decode)
        if at is None:
            return
        victim = source.pop(at, min_decode)
        out.append(Evict(victim.id, source.id, victim.context, EvictReason.SOURCE))
        fitting = (c for c in range(len(index)) if index.fits(c, victim.context))
        target = next(fitting, None)
        if target is None:
            return
        blocked = index.place_on(target, victim.id, victim.context, out) > 0
