"""Pacing the throughput arc: long out at the floor, short in by tight fit.

While short work remains for a version, every worker keeps its headroom at or above
`h_min` by departing its longest residents, and pending work is placed shortest first
onto the feasible worker left with the least headroom. The first keeps the active batch
large and the mean context low; the second is what turns a uniform pool into throughput
workers (kept nearly full of short work) and tail workers (kept free for long work).
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Iterable, Mapping, Sequence
from typing import Literal

from cadence.operator.scheduler.actions import Action, Evict, EvictReason, Place
from cadence.operator.scheduler.admission import may_start
from cadence.operator.scheduler.snapshot import FreshSample, PendingTrajectory
from cadence.operator.scheduler.working import WorkingWorker

Fit = Literal["tight", "worst"]
Candidate = PendingTrajectory | FreshSample


def evict_longest_to_floor(worker: WorkingWorker, min_decode: int, out: list[Action]) -> None:
    """Floor rule (pacing): while H_w is below the worker's floor, depart the longest resident.

    The longest resident frees the most KV per departure and removes the most context
    pressure. Residents still inside the anti-thrash window are skipped; if none is
    eligible the worker stays below the floor until one is.
    """
    while worker.headroom < worker.floor():
        index = worker.longest_evictable(min_decode)
        if index is None:
            return
        victim = worker.pop(index, min_decode)
        out.append(Evict(victim.id, worker.id, victim.context, EvictReason.FLOOR))


def placement_feasible(worker: WorkingWorker, context: int) -> bool:
    """Placement threshold (pacing): a seat in the engine's batch, and
    H_after >= h_min + delta * (|A_w| + 1).

    The per-resident reserve delta absorbs the growth of everything decoding on the
    worker, the incoming trajectory included; the gap between this threshold and the floor
    stops a worker that was just restored from being refilled straight back below it.
    A trajectory placed beyond the engine's sequence limit would only queue inside it.
    """
    n = worker.count + 1
    return worker.has_seat() and worker.headroom - context >= worker.floor(n) + worker.reserve * n


def _context(item: Candidate) -> int:
    return item.prompt_tokens if isinstance(item, FreshSample) else item.context


def _key(item: Candidate) -> tuple[int, str]:
    return (_context(item), item.id)


class _FitIndex:
    """Workers of one version ordered for the fit rule, in two tiers, with permanent
    discards.

    Tier 0 holds the workers whose decode is still memory-bound with one more trajectory,
    ordered by fit; tier 1 those it would tip into compute-bound, fewest residents first.
    A worker moves to tier 1 the first time the candidate at hand would tip it, for the
    rest of the pass. So tight fit fills a worker up to where its decode turns
    compute-bound and then goes on to the next; once every worker is there, work is
    spread evenly, since a compute-bound worker's throughput no longer grows with its
    batch but every resident's step time does. Where KV binds first (every worker stays
    in tier 0) it is the paper's tight fit unchanged.

    Candidates arrive in ascending context, and during a pass a worker's slack
    (H_w - floor - delta * |A_w|) and free seats only fall. So a worker that cannot take
    the current candidate cannot take any later one either, and is dropped for the rest
    of the pass. That makes the pass O((P + W) log W) instead of O(P * W).
    """

    __slots__ = ("_sign", "_tiers", "version")

    def __init__(self, version: int, workers: Iterable[WorkingWorker], fit: Fit) -> None:
        self.version = version
        self._sign = 1 if fit == "tight" else -1
        self._tiers: tuple[list[tuple[int, str, WorkingWorker]], ...] = (
            [(self._sign * w.headroom, w.id, w) for w in workers],
            [],
        )
        heapq.heapify(self._tiers[0])

    def __bool__(self) -> bool:
        return any(self._tiers)

    def _top(self, context: int) -> tuple[int, WorkingWorker] | None:
        open_, bound = self._tiers
        while open_:
            worker = open_[0][2]
            if not placement_feasible(worker, context):
                heapq.heappop(open_)
            elif worker.saturated_with(context):
                heapq.heappop(open_)
                heapq.heappush(bound, self._entry(1, worker))
            else:
                return 0, worker
        while bound:
            worker = bound[0][2]
            if placement_feasible(worker, context):
                return 1, worker
            heapq.heappop(bound)
        return None

    def best(self, context: int) -> WorkingWorker | None:
        top = self._top(context)
        return None if top is None else top[1]

    def key_of_best(self, context: int) -> tuple[int, int, int, str]:
        # Tier first; ties across versions go to the newer version (fresher data), then id.
        top = self._top(context)
        assert top is not None
        tier, worker = top
        return (tier, self._entry(tier, worker)[0], -self.version, worker.id)

    def _entry(self, tier: int, worker: WorkingWorker) -> tuple[int, str, WorkingWorker]:
        if tier == 0:
            return (self._sign * worker.headroom, worker.id, worker)
        return (worker.count, worker.id, worker)

    def reposition(self, worker: WorkingWorker) -> None:
        for tier, heap in enumerate(self._tiers):
            if heap and heap[0][2] is worker:
                heapq.heapreplace(heap, self._entry(tier, worker))
                return


def place_by_fit(
    workers_by_version: Mapping[int, Sequence[WorkingWorker]],
    pending: Sequence[tuple[int, Sequence[PendingTrajectory]]],
    fresh_by_batch: Mapping[int, Sequence[FreshSample]],
    *,
    eta: int,
    out: list[Action],
    fit: Fit = "tight",
) -> None:
    """Placement rule (pacing): shortest first, each onto the tightest feasible worker.

    Candidates are the placeable trajectories of P_v (`pending`: runs of one version
    each, ascending) and the fresh samples (`fresh_by_batch`, ascending within a batch), all in one
    ascending order of context length: shorter work fits more workers, so placing it
    first keeps the large gaps for long work. A pending trajectory may go only to workers
    of its own version; a fresh sample of batch u to any version >= u - eta, and it binds
    to the version of the worker that takes it. Among feasible workers the one with the
    smallest headroom after placement wins (tight fit), preferring a worker whose decode
    stays memory-bound with it (see `_FitIndex`). `fit="worst"` picks the largest
    instead; it exists only as the paper's ablation and is never the default.

    The candidate streams are merged lazily, and a stream is dropped as soon as every
    worker it could use is full, so a backed-up P_v costs nothing to skip.
    """
    indexes = {v: _FitIndex(v, ws, fit) for v, ws in workers_by_version.items() if ws}
    newest_first = sorted(indexes.values(), key=lambda ix: -ix.version)
    # A stream is (candidates, the indexes its candidates may use, newest first).
    streams: list[tuple[Sequence[Candidate], list[_FitIndex]]] = [
        (ps, [indexes[v]]) for v, ps in pending if v in indexes and ps
    ]
    for batch, samples in fresh_by_batch.items():
        allowed = [ix for ix in newest_first if may_start(batch, ix.version, eta)]
        if allowed and samples:
            streams.append((samples, allowed))
    heap = [(_key(items[0]), n, 0) for n, (items, _) in enumerate(streams)]
    heapq.heapify(heap)
    while heap:
        (context, _), n, i = heap[0]
        items, allowed = streams[n]
        chosen: _FitIndex | None = None
        for ix in allowed:
            if ix.best(context) is not None and (
                chosen is None or ix.key_of_best(context) < chosen.key_of_best(context)
            ):
                chosen = ix
        if chosen is None:
            heapq.heappop(heap)  # every worker this stream may use is full: drop it
            continue
        worker = chosen.best(context)
        assert worker is not None and worker.version is not None
        item = items[i]
        worker.add(item.id, context)
        out.append(Place(item.id, worker.id, worker.version, context))
        chosen.reposition(worker)
        if i + 1 < len(items):
            heapq.heapreplace(heap, (_key(items[i + 1]), n, i + 1))
        else:
            heapq.heappop(heap)


def hold_for_waiting(
    workers_by_version: Mapping[int, Sequence[WorkingWorker]],
    pending: Sequence[tuple[int, Sequence[PendingTrajectory]]],
    placed: Container[str],
) -> dict[int, list[WorkingWorker]]:
    """Hold rule (pacing): the workers fresh work may use, given what P_v could not place.

    A departed trajectory too long for every gap would otherwise wait for ever in a busy
    pool: short fresh work takes each gap as it opens, and the longer a trajectory has
    run the longer the gap it needs. So each one that found no room holds one worker of
    its version, the roomiest left, against new work until it is placed: the residents
    there finish, and nothing new takes their place. Only departed work can hold a
    worker, and only from fresh work, so throughput work is never displaced.
    """
    pool: dict[int, list[WorkingWorker]] = {}
    for version, ws in workers_by_version.items():
        waiting = sum(
            1 for v, items in pending if v == version for p in items if p.id not in placed
        )
        if not waiting:
            pool[version] = list(ws)
            continue
        held = {w.id for w in heapq.nsmallest(waiting, ws, key=_roomiest_first)}
        pool[version] = [w for w in ws if w.id not in held]
    return pool


def _roomiest_first(w: WorkingWorker) -> tuple[int, str]:
    return (w.floor() - w.headroom, w.id)
