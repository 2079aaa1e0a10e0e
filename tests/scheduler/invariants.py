"""An independent reading of the rules every plan must keep, used as a test oracle.

`check_plan` knows nothing of how the policy reached its plan; it checks the plan
against the snapshot it was made from and raises AssertionError naming the broken rule.
"""

from __future__ import annotations

from collections.abc import Sequence

from cadence.scheduler import (
    Action,
    Admit,
    Advance,
    CadenceState,
    Evict,
    EvictReason,
    FreshSample,
    PendingTrajectory,
    Place,
    Snapshot,
)
from cadence.scheduler.admission import admission_limit
from cadence.scheduler.snapshot import WorkerView


def _floor_after(snap: Snapshot, w: WorkerView, count: int) -> int:
    """The floor a worker must keep with `count` residents: h_min, raised under auto to
    one control period of every resident's growth at its step rate at the cycle's start."""
    knobs = snap.knobs
    if not knobs.auto_h_min or w.cost is None:
        return knobs.h_min
    step = w.cost.step_s(len(w.residents), w.used)
    growth = max(1, -(-knobs.control_period_s // step)) if step > 0 else 0
    return max(knobs.h_min, int(growth) * count)


def check_plan(
    snap: Snapshot, state: CadenceState, actions: Sequence[Action], new_state: CadenceState
) -> None:
    knobs = snap.knobs
    workers = {w.id: w for w in snap.workers}
    resident_on = {r.id: w.id for w in snap.workers for r in w.residents}
    residents = {r.id: r for w in snap.workers for r in w.residents}
    pending = {p.id: p for p in snap.pending}
    fresh = {f.id: f for f in snap.fresh}
    used = {w.id: w.used for w in snap.workers}
    count = {w.id: len(w.residents) for w in snap.workers}
    old_sources = {
        wid for v, wid in state.sources.items() if workers.get(wid) and workers[wid].version == v
    }
    new_sources = set(new_state.sources.values())

    # Admission within the eta budget.
    admit = sum(a.groups for a in actions if isinstance(a, Admit))
    assert snap.admission.groups_admitted + admit <= admission_limit(snap), "admitted past eta"

    # Advances: only empty workers, never backwards, to the rule's version, last host stays.
    unfinished = {w.version for w in snap.workers if w.residents and w.version is not None}
    unfinished |= {p.version for p in snap.pending}
    hosts: dict[int, int] = {}
    for w in snap.workers:
        if not w.draining and w.version is not None and w.id not in old_sources:
            hosts[w.version] = hosts.get(w.version, 0) + 1
    advancing: set[str] = set()
    for a in actions:
        if not isinstance(a, Advance):
            continue
        w = workers[a.worker]
        assert not w.residents, f"{w.id} advanced with residents"
        assert not w.draining, f"draining {w.id} advanced"
        assert w.version is None or a.version > w.version, f"{w.id} advanced backwards"
        lo = -1 if w.version is None else w.version
        unhosted = [
            u for u in sorted(unfinished) if lo < u <= snap.newest_version and not hosts.get(u)
        ]
        assert a.version == (unhosted[0] if unhosted else snap.newest_version), (
            f"{w.id} advanced to {a.version}, rule says otherwise"
        )
        if w.version is not None and w.id not in old_sources:
            assert not any(p.placeable and p.version == w.version for p in snap.pending), (
                f"{w.id} left version {w.version} while its pending work waited"
            )
            assert not (w.version in unfinished and hosts.get(w.version, 0) <= 1), (
                f"last host {w.id} of version {w.version} left unfinished work"
            )
            hosts[w.version] -= 1
        hosts[a.version] = hosts.get(a.version, 0) + 1
        advancing.add(w.id)

    # Evictions and placements, applied in order.
    evicted: dict[str, tuple[str, int]] = {}
    left: set[tuple[str, str]] = set()
    placed: set[str] = set()
    make_room: dict[str, list[int]] = {}
    for a in actions:
        if isinstance(a, Evict):
            assert resident_on.get(a.trajectory) == a.worker, f"{a.trajectory} not on {a.worker}"
            assert a.trajectory not in evicted, f"{a.trajectory} evicted twice"
            r = residents[a.trajectory]
            assert r.decoded_since_placement >= knobs.min_decode, (
                f"{a.trajectory} evicted inside the anti-thrash window"
            )
            evicted[a.trajectory] = (a.worker, r.context)
            left.add((a.trajectory, a.worker))
            used[a.worker] -= r.context
            count[a.worker] -= 1
            if a.reason is EvictReason.MAKE_ROOM:
                make_room.setdefault(a.worker, []).append(r.context)
        elif isinstance(a, Place):
            t = a.trajectory
            assert t not in placed, f"{t} placed twice"
            placed.add(t)
            w = workers[a.worker]
            assert (t, a.worker) not in left, f"{t} evicted from {w.id} and placed back on it"
            assert not w.draining and a.worker not in advancing, f"{t} placed on leaving {w.id}"
            assert a.worker not in new_sources, f"{t} placed on concentration source {w.id}"
            assert a.version == w.version, "placement version differs from the worker's"
            item: PendingTrajectory | FreshSample | None = pending.get(t) or fresh.get(t)
            if isinstance(item, PendingTrajectory):
                assert item.placeable, f"{t} placed while waiting for its environment"
                assert item.version == w.version, f"{t} of v{item.version} on v{w.version}"
                assert a.context == item.context
            elif isinstance(item, FreshSample):
                batch = item.group // snap.admission.batch_size
                assert w.version is not None and w.version >= batch - knobs.eta, (
                    f"{t} of batch {batch} started on v{w.version}, beyond eta"
                )
                assert a.context == item.prompt_tokens
            else:
                assert t in evicted, f"{t} placed from nowhere"
                src, ctx = evicted[t]
                assert workers[src].version == w.version, f"{t} moved across versions"
                assert a.context == ctx
            for shed in make_room.pop(a.worker, []):
                assert shed < a.context, (
                    f"{w.id} displaced a resident of {shed} for a shorter {a.context}"
                )
            used[a.worker] += a.context
            count[a.worker] += 1
            assert used[a.worker] <= w.capacity, f"{w.id} over capacity"
            floor = _floor_after(snap, w, count[a.worker])
            assert w.capacity - used[a.worker] >= floor, f"{w.id} placed below the floor"
            if w.max_seqs is not None:
                assert count[a.worker] <= w.max_seqs, f"{w.id} placed past its sequence limit"
        else:
            continue
    assert not make_room, f"displaced residents with nothing taken in: {make_room}"
    for wid in new_sources:
        assert wid in workers and not workers[wid].draining, f"bad source {wid}"
        others = [
            o
            for o in snap.workers
            if o.id != wid
            and o.version == workers[wid].version
            and not o.draining
            and o.id not in advancing
        ]
        assert others, f"source {wid} is the only worker of its version"
    versions = [workers[wid].version for wid in new_sources]
    assert len(versions) == len(set(versions)), "two sources for one version"
