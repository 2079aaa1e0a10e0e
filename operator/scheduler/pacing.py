"""Pacing the throughput arc: long out at the floor, short in by tight fit.

While short work remains for a version, every worker keeps its headroom at or above
`h_min` by departing its longest residents, and pending work is placed shortest first
onto the feasible worker left with the least headroom. The first keeps the active batch
large and the mean context low; the second is what turns a uniform pool into throughput
workers (kept nearly full of short work) and tail workers (kept free for long work).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from cadence.operator.scheduler.actions import Action, Evict, EvictReason, Place
from cadence.operator.scheduler.admission import may_start
from cadence.operator.scheduler.snapshot import FreshSample, PendingTrajectory
from cadence.operator.scheduler.working import WorkingWorker

Fit = Literal["tight", "worst"]
Candidate = PendingTrajectory | FreshSample


def evict_longest_to_floor(
    worker: WorkingWorker, h_min: int, min_decode: int, out: list[Action]
) -> None:
    """Floor rule (pacing): while H_w < h_min, depart the longest resident.

    The longest resident frees the most KV per departure and removes the most context
    pressure. Residents still inside the anti-thrash window are skipped; if none is
    eligible the worker stays below the floor until one is.
    """
    while worker.headroom < h_min:
        index = worker.longest_evictable(min_decode)
        if index is None:
            return
        victim = worker.pop(index, min_decode)
        out.append(Evict(victim.id, worker.id, victim.context, EvictReason.FLOOR))


def placement_feasible(worker: WorkingWorker, context: int, h_min: int, delta: int) -> bool:
    """Placement threshold (pacing): H_after >= h_min + delta * (|A_w| + 1).

    The per-resident reserve delta absorbs the growth of everything decoding on the
    worker, the incoming trajectory included; the gap between this threshold and the floor
    stops a worker that was just restored from being refilled straight back below it.
    """
    return worker.headroom - context >= h_min + delta * (worker.count + 1)


def _context(item: Candidate) -> int:
    return item.prompt_tokens if isinstance(item, FreshSample) else item.context


def _key(item: Candidate) -> tuple[int, str]:
    return (_context(item), item.id)


class _FitIndex:
    """Workers of one version ordered for the fit rule, with permanent discards.

    Candidates arrive in ascending context, and during a placement pass a worker's slack
    (H_w - delta * |A_w|) only falls. So a worker that cannot take the current candidate
    cannot take any later one either, and is dropped for the rest of the pass. That makes
    the pass O((P + W) log W) instead of O(P * W).
    """

    __slots__ = ("_heap", "_sign", "version")

    def __init__(self, version: int, workers: Iterable[WorkingWorker], fit: Fit) -> None:
        self.version = version
        self._sign = 1 if fit == "tight" else -1
        self._heap = [(self._sign * w.headroom, w.id, w) for w in workers]
        heapq.heapify(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def best(self, context: int, h_min: int, delta: int) -> WorkingWorker | None:
        heap = self._heap
        while heap:
            worker = heap[0][2]
            if placement_feasible(worker, context, h_min, delta):
                return worker
            heapq.heappop(heap)
        return None

    def key_of_best(self) -> tuple[int, int, str]:
        # Ties across versions go to the newer version (fresher data), then worker id.
        h, wid, _ = self._heap[0]
        return (h, -self.version, wid)

    def reposition_best(self) -> None:
        worker = self._heap[0][2]
        heapq.heapreplace(self._heap, (self._sign * worker.headroom, worker.id, worker))


def place_by_fit(
    workers_by_version: Mapping[int, Sequence[WorkingWorker]],
    pending: Sequence[tuple[int, Sequence[PendingTrajectory]]],
    fresh_by_batch: Mapping[int, Sequence[FreshSample]],
    *,
    h_min: int,
    delta: int,
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
    smallest headroom after placement wins (tight fit). `fit="worst"` picks the largest
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
            if ix.best(context, h_min, delta) is not None and (
                chosen is None or ix.key_of_best() < chosen.key_of_best()
            ):
                chosen = ix
        if chosen is None:
            heapq.heappop(heap)  # every worker this stream may use is full: drop it
            continue
        worker = chosen.best(context, h_min, delta)
        assert worker is not None and worker.version is not None
        item = items[i]
        worker.add(item.id, context)
        out.append(Place(item.id, worker.id, worker.version, context))
        chosen.reposition_best()
        if i + 1 < len(items):
            heapq.heapreplace(heap, (_key(items[i + 1]), n, i + 1))
        else:
            heapq.heappop(heap)
