"""Dispatch shared by the verl-style baselines: fresh samples to the server with the
fewest requests assigned so far (in effect round-robin), and multi-turn requests back to
the server they were on."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from cadence.scheduler.actions import Action, Place
from cadence.scheduler.snapshot import FreshSample, PendingTrajectory, WorkerView


def least_assigned(
    fresh: Iterable[FreshSample],
    workers: Sequence[WorkerView],
    assigned: Mapping[str, int],
    out: list[Action],
) -> Mapping[str, int]:
    """Place every fresh sample on the worker with the fewest assigned so far (ties by
    id); the engine queues what does not fit. Returns the updated counts."""
    counts = dict(assigned)
    heap = [(counts.get(w.id, 0), w.id, w) for w in workers if w.version is not None]
    heapq.heapify(heap)
    if not heap:
        return MappingProxyType(counts)
    for sample in fresh:
        n, wid, w = heap[0]
        assert w.version is not None
        out.append(Place(sample.id, wid, w.version, sample.prompt_tokens))
        counts[wid] = n + 1
        heapq.heapreplace(heap, (n + 1, wid, w))
    return MappingProxyType(counts)


def sticky_returns(
    pending: Iterable[PendingTrajectory], workers: Mapping[str, WorkerView], out: list[Action]
) -> None:
    """Send each trajectory back from its environment to the worker it came from."""
    for p in pending:
        w = workers.get(p.parked_on or "")
        if p.placeable and w is not None and w.version == p.version and not w.draining:
            out.append(Place(p.id, w.id, p.version, p.context))
