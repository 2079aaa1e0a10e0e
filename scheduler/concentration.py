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
from collections.abc import Mapping, Sequence

from cadence.scheduler.actions import Action, Evict, EvictReason, Place
from cadence.scheduler.moves import MoveRule
from cadence.scheduler.snapshot import PendingTrajectory
from cadence.scheduler.working import WorkingWorker


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


def evict_shortest_to_floor(worker: WorkingWorker, min_decode: int, out: list[Action]) -> None:
    """Floor rule (concentration target): while H_w is below its floor, depart the shortest
    resident, keeping any departure the floor turns out not to need.

    A target is where the long tail is being gathered, so it keeps its long residents and
    sheds short ones, which find room elsewhere more easily. Shortest first can overshoot:
    after 10 and 60 the floor may hold with room for the 10 again. Such a departure is not
    made, so no trajectory leaves a worker only to be placed back on it in the same plan.
    """
    residents = worker.residents
    chosen: list[int] = []  # indices into residents, descending: shortest first
    freed = 0
    i = len(residents) - 1
    while i >= 0 and worker.headroom + freed < worker.floor(worker.count - len(chosen)):
        if residents[i].decoded_since_placement >= min_decode:
            chosen.append(i)
            freed += residents[i].context
        i -= 1
    for k in range(len(chosen) - 2, -1, -1):  # the last one taken was needed
        context = residents[chosen[k]].context
        left = worker.count - len(chosen) + 1
        if worker.headroom + freed - context >= worker.floor(left):
            freed -= context
            del chosen[k]
    for index in chosen:  # descending indices: each pop leaves the rest in place
        victim = worker.pop(index, min_decode)
        out.append(Evict(victim.id, worker.id, victim.context, EvictReason.FLOOR))


Stream = tuple[Sequence[PendingTrajectory], Sequence[int]]
"""Placeable pending trajectories ascending by (context, id), and their contexts."""

_Pick = tuple[int, str, int, int]  # (context, id, stream, position)
_Class = tuple[int, str]  # (affinity rank, transfer group with a move rule, else "")


class TargetIndex:
    """The targets of one version, for the concentration placement rule.

    A target can take a pending trajectory into its margin, or by departing residents
    shorter than the trajectory; the rule places the longest trajectory a target can take
    onto the first such target in order of affinity rank, then margin. Within a rank two
    targets are candidates at any time: the one with the most margin (no one takes more
    without displacing anyone) and the one with the most reach, margin plus evictable KV
    (no one takes more by displacing). Each candidate's own pick, the longest trajectory
    it can take, sits in one heap in the rule's order; an entry is recomputed when it
    reaches the top stale (its worker changed, or its pick was taken). Offering every
    target instead would recompute every target that shared the pick after each
    placement: at 1,024 workers that took seconds a cycle.

    Pending trajectories come longest first and most of them, in a backed-up P_v, fit
    nowhere. `_next_fit` finds the longest one a target can take by bisecting over the
    pending contexts instead of trying each in turn: with the target's evictable residents
    sorted e_0 <= e_1 <= ..., a trajectory of context c in (e_{k-1}, e_k] fits iff
    c <= margin + (e_0 + ... + e_{k-1}), so each segment is one range query.

    With a move rule, two targets otherwise equal for a trajectory (same rank and margin)
    go by the cheaper move (a KV pull first, `moves.py`). Under migration kv each rank is
    split by transfer group, and a target takes only trajectories whose source is in its
    group, or that may go anywhere (`MoveRule.restriction`).
    """

    __slots__ = (
        "_by_rank",
        "_changes",
        "_classes",
        "_his",
        "_left",
        "_moves",
        "_pickers",
        "_picks",
        "_reach",
        "_split",
        "_streams",
        "min_decode",
    )

    def __init__(
        self,
        targets: Sequence[WorkingWorker],
        streams: Sequence[Stream],
        min_decode: int,
        left: Mapping[str, str] | None = None,
        moves: MoveRule | None = None,
    ) -> None:
        self.min_decode = min_decode
        self._moves = moves
        # Targets are classed by rank and, with a move rule, by transfer group: each class
        # offers its own candidates, so targets equal but for their group both compete.
        self._split = moves is not None
        # Trajectories that left a worker this cycle, by the worker: never placed back
        # on it in the same plan (a target making room can open the gap they left).
        self._left = left or {}
        self._streams = streams
        self._his = [len(items) for items, _ in streams]
        self._changes = {w.id: 0 for w in targets}
        # Per rank, each candidate with its pick, its worker's stamp when the pick was
        # computed, and its margin then.
        self._picks: dict[_Class, list[tuple[WorkingWorker, _Pick | None, int, int]]] = {}
        # The classes whose candidates picked a trajectory, by its id (a superset: a
        # class refreshed for nothing keeps its picks).
        self._pickers: dict[str, list[_Class]] = {}
        # Per class, highest rank first: max-heaps by margin and by reach, stamped.
        by_rank: dict[_Class, list[tuple[int, str, int, WorkingWorker]]] = {}
        reach: dict[_Class, list[tuple[int, str, int, WorkingWorker]]] = {}
        for w in targets:
            c = self._class_of(w)
            by_rank.setdefault(c, []).append((-w.margin(), w.id, 0, w))
            reach.setdefault(c, []).append((-self._reach_of(w), w.id, 0, w))
        self._classes = {rank: by_rank[rank] for rank in sorted(by_rank, reverse=True)}
        self._by_rank: dict[int, list[_Class]] = {}
        for c in self._classes:
            self._by_rank.setdefault(c[0], []).append(c)
        self._reach = reach
        for rank in self._classes:
            heapq.heapify(self._classes[rank])
            heapq.heapify(self._reach[rank])
            self._refresh(rank)

    def _class_of(self, w: WorkingWorker) -> _Class:
        return (w.affinity, (w.view.transfer_group or "") if self._split else "")

    def _reach_of(self, w: WorkingWorker) -> int:
        return w.margin() + w.evictable_kv(self.min_decode)

    def _candidates(self, rank: _Class) -> list[WorkingWorker]:
        """The rank's top by margin and top by reach (one worker if they coincide)."""
        out: list[WorkingWorker] = []
        for heap in (self._classes[rank], self._reach[rank]):
            while heap and heap[0][2] != self._changes[heap[0][1]]:
                heapq.heappop(heap)
            if heap and heap[0][3] not in out:
                out.append(heap[0][3])
        return out

    def fits(self, w: WorkingWorker, context: int) -> bool:
        """Can `w` take `context`, departing only residents shorter than it?"""
        if not w.has_seat():
            return False
        return w.margin() + w.freeable_below(context, self.min_decode) >= context

    def _next_fit(self, w: WorkingWorker, budget: int, contexts: Sequence[int], hi: int) -> int:
        """The largest j < hi such that `w`, with `budget` of margin, can take a
        trajectory of `contexts[j]` (ascending); -1 if none."""
        if hi <= 0:
            return -1
        cmax = contexts[hi - 1]
        if cmax <= budget:
            return hi - 1  # the longest left fits without displacing anyone
        # `shorter` may run past cmax: only its first `seg` are shorter.
        shorter, sums, seg = w.evictable_below(cmax, self.min_decode)
        freed = sums[seg]  # evicting every resident shorter than cmax
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
            if seg < len(shorter) and shorter[seg] < upper:  # never past cmax: upper <= cmax
                upper = shorter[seg]
            if upper > lower:
                j = bisect_right(contexts, upper, 0, hi) - 1
                if j >= 0 and contexts[j] > lower:
                    return j
            cmax = lower
            seg -= 1
            freed -= lower
        return -1

    def _pick(self, w: WorkingWorker, budget: int) -> _Pick | None:
        """The longest remaining candidate `w` (with `budget` of margin) can take, over
        all streams."""
        if not w.has_seat():
            return None
        best: _Pick | None = None
        left, moves = self._left, self._moves
        for n, (items, contexts) in enumerate(self._streams):
            hi = self._his[n]
            if not hi or (best is not None and contexts[hi - 1] < best[0]):
                continue
            j = self._next_fit(w, budget, contexts, hi)
            while j >= 0 and (
                left.get(items[j].id) == w.id
                or (moves is not None and not moves.allowed(items[j], w.view))
            ):
                j = self._next_fit(w, budget, contexts, j)
            if j >= 0 and (best is None or (contexts[j], items[j].id) > best[:2]):
                best = (contexts[j], items[j].id, n, j)
        return best

    def _refresh(self, rank: _Class) -> None:
        """Make the rank's candidates current, each with an up-to-date pick."""
        kept = self._picks.get(rank, ())  # at most two: a linear search is cheapest
        entries = []
        for w in self._candidates(rank):
            pick, stamp = None, -1
            for e in kept:
                if e[0] is w:
                    pick, stamp = e[1], e[2]
                    break
            margin = w.margin()
            if stamp != self._changes[w.id] or not self._live(pick):
                pick, stamp = self._pick(w, margin), self._changes[w.id]
            entries.append((w, pick, stamp, margin))
            if pick is not None:
                self._pickers.setdefault(pick[1], []).append(rank)
        self._picks[rank] = entries

    def _live(self, pick: _Pick | None) -> bool:
        return pick is not None and pick[3] < self._his[pick[2]]

    def place_next(self, out: list[Action]) -> int | None:
        """Place the longest trajectory any target can take; return how many residents
        it displaced, or None when no target can take any."""
        best: tuple[tuple[int, str, int, int], WorkingWorker, _Pick] | None = None
        for rank, entries in self._picks.items():
            for w, pick, _, margin in entries:
                if pick is not None:
                    key = (pick[0], pick[1], rank[0], margin)
                    if (
                        best is None
                        or key > best[0]
                        or (
                            key == best[0]
                            and self._preference(pick, w) > self._preference(pick, best[1])
                        )
                    ):
                        best = (key, w, pick)
        if best is None:
            return None
        _, w, (context, trajectory, n, j) = best
        # Everything this long or longer has been placed or fits nowhere.
        self._his = [
            j if m == n else _count_below(st, (context, trajectory), self._his[m])
            for m, st in enumerate(self._streams)
        ]
        displaced = self.place_on(w, trajectory, context, out)
        # Its class changed; and every class whose candidate picked it needs a new pick
        # (no other pick went stale: the one placed was the longest).
        for c in {self._class_of(w), *self._pickers.pop(trajectory, ())}:
            self._refresh(c)
        return displaced

    def _preference(self, pick: _Pick, w: WorkingWorker) -> tuple[int, float]:
        """Higher is better: the move's preference key, negated (0s without a rule)."""
        if self._moves is None:
            return (0, 0.0)
        rank, seconds = self._moves.of(self._streams[pick[2]][0][pick[3]], w.view).key()
        return (-rank, -seconds)

    def first_fit(
        self, context: int, source: WorkingWorker | None = None, group: str | None = None
    ) -> WorkingWorker | None:
        """The first target, in order of affinity rank then margin, that can take
        `context` (leaving `source`). A rank's top by margin takes it without displacing
        anyone or no worker of that rank can; only then are the others tried, and the
        first that can would displace someone, which stops the source for this cycle: one
        scan per cycle. Equal margins go by the cheaper move; `group`: under migration kv,
        the only transfer group it may go to."""
        for classes in self._by_rank.values():
            heaps = []
            for c in classes:
                if group is not None and c[1] != group:
                    continue
                heap = self._classes[c]
                while heap and heap[0][2] != self._changes[heap[0][1]]:
                    heapq.heappop(heap)  # a stale entry; its worker was re-entered
                if heap:
                    heaps.append(heap)
            if not heaps:
                continue
            if len(heaps) == 1:  # one group: margin, then id (tuples compare in C)
                top = heaps[0][0]
                if -top[0] >= context and top[3].has_seat():
                    return top[3]
                ordered = sorted(heaps[0])
            else:

                def order(
                    e: tuple[int, str, int, WorkingWorker],
                ) -> tuple[int, tuple[int, float], str]:
                    return (e[0], self._move_key(context, source, e[3]), e[1])

                top = min((heap[0] for heap in heaps), key=order)
                if -top[0] >= context and top[3].has_seat():
                    return top[3]
                ordered = sorted((e for heap in heaps for e in heap), key=order)
            for _, _, changes, w in ordered:
                if changes == self._changes[w.id] and self.fits(w, context):
                    return w
        return None

    def _move_key(
        self, context: int, source: WorkingWorker | None, w: WorkingWorker
    ) -> tuple[int, float]:
        if self._moves is None or source is None:
            return (0, 0.0)
        return self._moves.between(context, source.view, w.view).key()

    def place_on(
        self, worker: WorkingWorker, trajectory: str, context: int, out: list[Action]
    ) -> int:
        """Placement rule (concentration): put the trajectory on `worker`, first departing
        its shortest evictable residents shorter than it if the floor needs it.
        Returns how many residents it displaced."""
        need = context - worker.margin()
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
        self._changes[worker.id] += 1
        heapq.heappush(
            self._classes[self._class_of(worker)],
            (-worker.margin(), worker.id, self._changes[worker.id], worker),
        )
        return len(victims)


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
    min_decode: int,
    out: list[Action],
    left: Mapping[str, str] | None = None,
    moves: MoveRule | None = None,
) -> None:
    """One cycle of concentration for one version (`left`: this cycle's departures, each
    to the worker it left, which will not take it back).

    Placeable pending trajectories (P_v as observed, and this cycle's floor departures,
    each an ascending `Stream`) go longest first onto the targets: each to the first
    target, in order of affinity rank then margin, that can take it. Then, backpressure:
    the source departs its next longest resident only while P_v holds no placeable
    trajectory, and each departure is offered to the targets at once; the first one they
    cannot absorb stays in P_v and stops the source for this cycle. Under migration kv a
    departure goes only to a target of the source's group while one serves the version.
    """
    index = TargetIndex(targets, streams, min_decode, left, moves)
    placed = displaced = 0
    while (moved := index.place_next(out)) is not None:
        placed += 1
        displaced += moved
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
        group = None
        if moves is not None and source.version is not None:
            group = moves.restricts_from(source.view, source.version)
        target = index.first_fit(victim.context, source, group)
        if target is None:
            return
        blocked = index.place_on(target, victim.id, victim.context, out) > 0
