"""Work conservation: a version's tail moves to faster workers that would otherwise idle.

Concentration, as the paper has it, starts only when a newer version has fresh work for
the emptied source. Until the trainer publishes it, which waits on the very tail that is
decoding, nothing moves: once a version's fresh work is exhausted, its high-affinity
workers finish their short work and idle while the long tail decodes on the slow ones.
The same happens within one affinity rank on compute-weak devices: the tail gathers
on a few workers whose decode is compute-bound, each resident's step slowed by all the
others, while their peers sit empty. This rule keeps them busy: the longest residents
move to workers of higher affinity, or of the same affinity stepping faster, with room,
each move only if the decode time it saves at the target's step rate exceeds what it
costs there. A move never goes down in affinity, the target takes it under the pacing
placement threshold (so its floor does not send it back), and the anti-thrash window
holds it there.

What a move costs follows the move rule (`moves.py`): a KV pull within the source's
transfer group delays only the moved trajectory, by its transfer time; a re-prefill
stalls every resident of the target for the prefill. So within a group (or across,
under migration reprefill) the same saving buys different moves, and under migration kv
a resident moves only within its source's group.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from functools import partial

from cadence.scheduler.actions import Action, Evict, EvictReason, Place
from cadence.scheduler.moves import Move, MoveRule
from cadence.scheduler.working import WorkingWorker

LOOKS = 8


def _run(
    w: WorkingWorker, most: int, min_decode: int
) -> Iterator[tuple[int, str, int, WorkingWorker]]:
    for r in w.longest_first_within(most, min_decode):
        yield (-r.context, r.id, r.decoded_since_placement, w)


def _order(c: tuple[int, str, int, WorkingWorker]) -> tuple[int, str]:
    return (c[0], c[1])


def _slack(w: WorkingWorker) -> int:
    """The longest trajectory the pacing placement threshold lets `w` take now."""
    if not w.has_seat():
        return -1
    n = w.count + 1
    return w.headroom - w.floor(n) - w.reserve * n


def worth_moving(
    context: int,
    decoded: int,
    source: WorkingWorker,
    target: WorkingWorker,
    period_s: float,
    *,
    move: Move | Callable[[], Move] | None = None,
) -> bool:
    """Does moving a trajectory of `context` tokens, `decoded` of them generated where it
    is, from `source` to `target` pay for itself?

    What is left to decode is unknown; what it has decoded here stands for it (a
    trajectory that has run long tends to run on, and one that has barely started, or a
    short answer, is not worth a move). The move saves that many steps' difference in
    step time and costs, as trajectory-seconds lost, a prefill of the whole context on
    the target, during which every one of the target's residents waits, or, where `move`
    is a KV pull, the transfer, during which only the moved trajectory waits; plus up to
    a control period off both engines while the hand-off runs. `move` may be a function
    that prices it: it is called only when the saving exceeds the period, as a move
    never costs less than nothing.
    """
    src, tgt = source.cost, target.cost
    if src is None or tgt is None:
        return False
    saved = decoded * (
        src.step_s(source.count, source.used) - tgt.step_s(target.count + 1, target.used + context)
    )
    if saved <= period_s:
        return False
    if callable(move):
        move = move()
    if move is not None and move.kind == "kv":
        cost = move.seconds
    else:
        cost = tgt.prefill_s(context) * (target.count + 1)
    return saved > cost + period_s


def lift_tail(
    workers: Sequence[WorkingWorker],
    min_decode: int,
    period_s: float,
    out: list[Action],
    moves: MoveRule | None = None,
) -> int:
    """One version's work-conservation pass; returns the number of moves.

    Candidates go longest first, each to the first worker of its own affinity or higher,
    highest rank first and then most slack, that can take it under the placement threshold
    and for which the move pays. Only workers stepping slower than the fastest target are
    taken from, only what some target of their rank or higher has room for, and at most
    `LOOKS` candidates a target are looked at in a cycle, so a pool whose tail cannot move
    costs little to plan.
    """
    slack = {w.id: _slack(w) for w in workers if w.accepting and w.cost is not None}
    targets = [w for w in workers if slack.get(w.id, 0) > 0]
    if not targets:
        return 0
    # The longest trajectory any target of this rank or a higher one could take.
    best_slack: dict[int, int] = {}
    for t in targets:
        best_slack[t.affinity] = max(best_slack.get(t.affinity, 0), slack[t.id])
    reach: dict[int, int] = {}
    for rank in sorted(best_slack, reverse=True):
        reach[rank] = max(best_slack[rank], max(reach.values(), default=0))

    def reach_of(affinity: int) -> int:
        return max((r for rank, r in reach.items() if rank >= affinity), default=0)

    fastest = min(t.cost.step_s(t.count + 1, t.used) for t in targets if t.cost is not None)
    sources = [
        w
        for w in workers
        if w.accepting
        and w.cost is not None
        and reach_of(w.affinity) > 0
        and w.cost.step_s(w.count, w.used) > fastest
    ]
    # Residents are kept longest first: merge the sources' lazily, longest first overall.
    runs = [_run(w, reach_of(w.affinity), min_decode) for w in sources]
    merged = heapq.merge(*runs, key=_order)
    looked = itertools.islice(merged, LOOKS * len(targets))
    candidates = ((-neg, rid, decoded, w) for neg, rid, decoded, w in looked)
    changes = {w.id: 0 for w in targets}
    split = moves is not None and moves.migration == "kv"
    # Per affinity rank (and, under migration kv, per transfer group): most slack on top.
    by_rank: dict[tuple[int, str], list[tuple[int, str, int, WorkingWorker]]] = {}
    for w in targets:
        part = (w.view.transfer_group or "") if split else ""
        by_rank.setdefault((w.affinity, part), []).append((-slack[w.id], w.id, 0, w))
    classes = sorted(by_rank, reverse=True)
    for heap in by_rank.values():
        heapq.heapify(heap)
    made = 0
    for context, rid, decoded, source in candidates:
        group = None
        if split and moves is not None and source.version is not None:
            group = moves.restricts_from(source.view, source.version)
        for cls in classes:
            if cls[0] < source.affinity:
                break
            if group is not None and cls[1] != group:
                continue
            heap = by_rank[cls]
            while heap and heap[0][2] != changes[heap[0][1]]:
                heapq.heappop(heap)
            if not heap or -heap[0][0] < context:
                continue
            target = heap[0][3]
            if target is source:
                continue
            price = (
                None if moves is None else partial(moves.between, context, source.view, target.view)
            )
            if not worth_moving(context, decoded, source, target, period_s, move=price):
                continue
            at = next(i for i, r in enumerate(source.residents) if r.id == rid)
            source.pop(at, min_decode)
            out.append(Evict(rid, source.id, context, EvictReason.LIFT))
            target.add(rid, context)
            assert target.version is not None
            out.append(Place(rid, target.id, target.version, context))
            changes[target.id] += 1
            heapq.heappush(heap, (-_slack(target), target.id, changes[target.id], target))
            made += 1
            break
    return made
