"""Pacing the throughput arc: long out at the floor, short in by tight fit.

While short work remains for a version, every worker keeps its headroom at or above
`h_min` by departing its longest residents, and pending work is placed shortest first
onto the feasible worker left with the least headroom. The first keeps the active batch
large and the mean context low; the second is what turns a uniform pool into throughput
workers (kept nearly full of short work) and tail workers (kept free for long work).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Container, Iterable, Mapping, Sequence
from typing import Literal

from cadence.scheduler.actions import Action, Evict, EvictReason, Place
from cadence.scheduler.admission import may_start
from cadence.scheduler.moves import MoveRule
from cadence.scheduler.snapshot import FreshSample, PendingTrajectory
from cadence.scheduler.working import WorkingWorker

# tight: the default, tight fit where room is short (see `_FitIndex`); packed: the
# paper's tight fit on every worker, the roomy ones too; worst: the paper's ablation.
Fit = Literal["tight", "packed", "worst"]
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
    return worker.can_take(context)


def _context(item: Candidate) -> int:
    return item.prompt_tokens if isinstance(item, FreshSample) else item.context


def _key(item: Candidate) -> tuple[int, str]:
    return (_context(item), item.id)


# (key, then a second key, worker id, worker): what a tier orders its workers by.
_Entry = tuple[int, int, str, WorkingWorker]


class _FitIndex:
    """Workers of one version ordered for the fit rule, in three tiers, with permanent
    discards.

    Tier 0 holds the workers short of room: after taking the candidate they could no
    longer take a trajectory of the longest context any may reach (`Knobs.max_model_len`)
    on top of their floor and reserve. They are ordered by fit, and go first: this is the
    paper's tight fit, which fills the smallest gap and keeps the larger ones for long
    work. Tier 1 holds the roomy workers, which would keep that much room. Among them no
    gap needs keeping, since no trajectory can need more: filling one only slows every
    step of its residents while the workers passed over step emptier. So they are
    ordered by the time their step would take with one more resident, fastest first,
    which spreads work over them and onto the faster devices.
    A roomy worker moves to tier 0 the first time the candidate at hand would take that
    room. Tier 2 holds the workers whose decode one more trajectory would tip into
    compute-bound, fewest residents first: a worker moves there the first time the
    candidate at hand would tip it. So where KV is scarce the fit is the paper's, up to
    where decode turns compute-bound; where KV is to spare work goes where it decodes
    fastest; and once every worker is compute-bound it is spread evenly, since such a
    worker's throughput no longer grows with its batch but every resident's step time
    does. A worker whose step cost is unknown is never roomy, nor is any when the longest
    context is unknown: then it is the paper's tight fit.

    Candidates arrive in ascending context, and during a pass a worker's slack
    (H_w - floor - delta * |A_w|) and free seats only fall. So a worker that cannot take
    the current candidate cannot take any later one either, and is dropped for the rest
    of the pass; a worker short of room stays so. That makes the pass O((P + W) log W)
    instead of O(P * W).
    """

    __slots__ = ("_room", "_sign", "_tiers", "version")

    def __init__(
        self,
        version: int,
        workers: Iterable[WorkingWorker],
        fit: Fit,
        room: int | None = None,
    ) -> None:
        self.version = version
        self._sign = -1 if fit == "worst" else 1
        # The ablations are the paper's, without the roomy tier.
        self._room = room if fit == "tight" else None
        tight: list[_Entry] = []
        roomy: list[_Entry] = []
        for w in workers:
            if self._roomy_with(w, 0):
                roomy.append(self._entry(1, w))
            else:
                tight.append(self._entry(0, w))
        heapq.heapify(tight)
        heapq.heapify(roomy)
        bound: list[_Entry] = []
        self._tiers = (tight, roomy, bound)

    def __bool__(self) -> bool:
        return any(self._tiers)

    def _roomy_with(self, worker: WorkingWorker, context: int) -> bool:
        """Would `worker`, having taken `context`, still have room for the longest?"""
        if self._room is None or worker.cost is None:
            return False
        n = worker.count + 1
        slack = worker.headroom - context - worker.floor(n) - worker.reserve * n
        return slack >= self._room

    def fit_key(self, context: int) -> tuple[int, int, WorkingWorker] | None:
        """(tier, key, worker) of the best worker for `context`; None if none. A worker
        changes only through this index during a pass (`reposition`), so the key on top
        is current."""
        tight, roomy, bound = self._tiers
        while tight or roomy:
            if tight:
                worker = tight[0][3]
                if not worker.can_take(context):
                    heapq.heappop(tight)
                elif worker.saturated_with(context):
                    heapq.heappush(bound, self._entry(2, heapq.heappop(tight)[3]))
                else:
                    return 0, tight[0][0], worker
                continue
            worker = roomy[0][3]
            if not worker.can_take(context):
                heapq.heappop(roomy)
            elif worker.saturated_with(context):
                heapq.heappush(bound, self._entry(2, heapq.heappop(roomy)[3]))
            elif not self._roomy_with(worker, context):
                heapq.heappush(tight, self._entry(0, heapq.heappop(roomy)[3]))
            else:
                return 1, roomy[0][0], worker
        while bound:
            top = bound[0]
            worker = top[3]
            if worker.can_take(context):
                return 2, top[0], worker
            heapq.heappop(bound)
        return None

    def _entry(self, tier: int, worker: WorkingWorker) -> _Entry:
        if tier == 0:
            return (self._sign * worker.headroom, 0, worker.id, worker)
        if tier == 1:  # equal steps (a flat cost) go to the fewer residents
            assert worker.cost is not None
            step = worker.cost.step_s(worker.count + 1, worker.used)
            return (round(step * 1e9), worker.count, worker.id, worker)
        return (worker.count, 0, worker.id, worker)

    def reposition(self, worker: WorkingWorker) -> None:
        for tier, heap in enumerate(self._tiers):
            if heap and heap[0][3] is worker:
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
    moves: MoveRule | None = None,
    room: int | None = None,
    oldest_batch_first: bool = False,
) -> None:
    """Placement rule (pacing): shortest first, each onto the tightest feasible worker.

    Candidates are the placeable trajectories of P_v (`pending`: runs of one version
    each, ascending) and the fresh samples (`fresh_by_batch`, ascending within a batch), all in one
    ascending order of context length: shorter work fits more workers, so placing it
    first keeps the large gaps for long work. A pending trajectory may go only to workers
    of its own version; a fresh sample of batch u to any version >= u - eta, and it binds
    to the version of the worker that takes it. Among feasible workers the one with the
    smallest headroom after placement wins (tight fit) among the workers short of room
    for a trajectory of `room` tokens (the longest any may reach); a worker with that
    much to spare takes work only after them, fastest step first, and a worker whose
    decode one more trajectory would tip into compute-bound last (see `_FitIndex`).
    `fit="worst"` picks the largest instead; it exists only as the paper's ablation and
    is never the default.

    With `oldest_batch_first`, fresh samples go batch by batch, the earliest first (each
    batch shortest first): the trainer needs the oldest open batch whole before it can
    publish the version the newer batches wait on, so a sample of it that starts late
    delays every version after it. Without it all candidates are one ascending order
    (the paper's wording, and the pending pass, where every trajectory has started).

    With a move rule (`moves`), workers are indexed per version and transfer group: among
    equally tight fits a departed trajectory takes the one it moves to most cheaply (a
    KV pull before a re-prefill), and under migration kv it may use only its source's
    group while a worker of that group serves its version (`MoveRule.restriction`).

    The candidate streams are merged lazily, and a stream is dropped as soon as every
    worker it could use is full, so a backed-up P_v costs nothing to skip.
    """
    parts: dict[tuple[int, str], list[WorkingWorker]] = {}
    for v, ws in workers_by_version.items():
        for w in ws:
            group = w.view.transfer_group if moves is not None else None
            parts.setdefault((v, group or ""), []).append(w)
    indexes = {key: _FitIndex(key[0], ws, fit, room) for key, ws in parts.items()}
    of_version: dict[int, list[_FitIndex]] = {}
    for key in sorted(indexes, key=lambda k: (-k[0], k[1])):
        of_version.setdefault(key[0], []).append(indexes[key])
    newest_first = [ix for v in sorted(of_version, reverse=True) for ix in of_version[v]]
    # A stream is (candidates, the indexes its candidates may use, newest first, its
    # rank: streams of a lower rank go first, and equal ranks merge shortest first).
    streams: list[tuple[Sequence[Candidate], list[_FitIndex], int]] = []
    for v, ps in pending:
        if v not in of_version or not ps:
            continue
        if moves is None or moves.migration != "kv":
            streams.append((ps, of_version[v], 0))
            continue
        # kv: each departed trajectory only onto its source's group while one hosts v.
        runs: dict[str, list[PendingTrajectory]] = {}
        for p in ps:
            runs.setdefault(moves.restriction(p) or "", []).append(p)
        for group, run in sorted(runs.items()):
            allowed = of_version[v] if not group else [indexes[(v, group)]]
            if (v, group) in indexes or not group:
                streams.append((run, allowed, 0))
    for batch, samples in fresh_by_batch.items():
        allowed = [ix for ix in newest_first if may_start(batch, ix.version, eta)]
        if allowed and samples:
            streams.append((samples, allowed, batch if oldest_batch_first else 0))
    heap = [(rank, _key(items[0]), n, 0) for n, (items, _, rank) in enumerate(streams)]
    heapq.heapify(heap)
    while heap:
        rank, (context, _), n, i = heap[0]
        items, allowed, _ = streams[n]
        item = items[i]
        chosen = _choose(allowed, context, item, moves)
        if chosen is None:
            heapq.heappop(heap)  # every worker this stream may use is full: drop it
            continue
        ix, worker = chosen
        assert worker.version is not None
        worker.add(item.id, context)
        out.append(Place(item.id, worker.id, worker.version, context))
        ix.reposition(worker)
        if i + 1 < len(items):
            heapq.heapreplace(heap, (rank, _key(items[i + 1]), n, i + 1))
        else:
            heapq.heappop(heap)


def _choose(
    allowed: Sequence[_FitIndex], context: int, item: Candidate, moves: MoveRule | None
) -> tuple[_FitIndex, WorkingWorker] | None:
    """The index and worker the fit rule picks for `item` among `allowed`: the best fit
    over all of them; among equally tight fits a departed trajectory goes where the move
    is cheapest (a KV pull first, `moves.py`), then to the newer version, then by id."""
    best: tuple[int, int] | None = None
    tied: list[tuple[_FitIndex, WorkingWorker]] = []
    for ix in allowed:
        found = ix.fit_key(context)
        if found is None:
            continue
        key = (found[0], found[1])
        if best is None or key < best:
            best, tied = key, [(ix, found[2])]
        elif key == best:
            tied.append((ix, found[2]))
    if best is None:
        return None
    if len(tied) == 1:
        return tied[0]
    if moves is not None and isinstance(item, PendingTrajectory):
        return min(tied, key=lambda t: (moves.of(item, t[1].view).key(), -t[0].version, t[1].id))
    return min(tied, key=lambda t: (-t[0].version, t[1].id))


def hold_for_waiting(
    workers_by_version: Mapping[int, Sequence[WorkingWorker]],
    pending: Sequence[tuple[int, Sequence[PendingTrajectory]]],
    placed: Container[str],
    moves: MoveRule | None = None,
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
        if moves is None or moves.migration != "kv":
            held = {w.id for w in heapq.nsmallest(waiting, ws, key=_roomiest_first)}
        else:
            held = _hold_by_group(ws, pending, version, placed, moves)
        pool[version] = [w for w in ws if w.id not in held]
    return pool


def _hold_by_group(
    ws: Sequence[WorkingWorker],
    pending: Sequence[tuple[int, Sequence[PendingTrajectory]]],
    version: int,
    placed: Container[str],
    moves: MoveRule,
) -> set[str]:
    """Under migration kv a trajectory can use only its source's group: it holds the
    roomiest worker of that group (those that may go anywhere hold from what is left)."""
    needs = Counter(
        moves.restriction(p) or ""
        for v, items in pending
        if v == version
        for p in items
        if p.id not in placed
    )
    held: set[str] = set()
    for group, n in sorted(needs.items(), key=lambda kv: (not kv[0], kv[0])):
        free = [w for w in ws if w.id not in held and (not group or w.view.transfer_group == group)]
        held.update(w.id for w in heapq.nsmallest(n, free, key=_roomiest_first))
    return held


def _roomiest_first(w: WorkingWorker) -> tuple[int, str]:
    return (w.floor() - w.headroom, w.id)
