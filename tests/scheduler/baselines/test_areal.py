"""AReaL-like: weight switches interrupt and resubmit in place; dispatch round robin."""

from __future__ import annotations

from cadence.scheduler import EvictReason
from cadence.scheduler.baselines.areal import ArealPolicy
from cadence.scheduler.baselines.sync import DispatchState

from ..factories import make_fresh, make_knobs, make_snapshot, make_worker
from ..helpers import advances, evictions, placed_on


def test_areal_pauses_aborts_and_resubmits_in_place_on_new_weights() -> None:
    old = make_worker("old", version=0, residents=[300, 100])
    new = make_worker("new", version=1, residents=[50])
    snap = make_snapshot([old, new], newest=1, knobs=make_knobs(eta=1))
    actions, _ = ArealPolicy().plan(snap, DispatchState())
    assert [(e.trajectory, e.reason) for e in evictions(actions)] == [
        ("old-r0", EvictReason.INTERRUPT),
        ("old-r1", EvictReason.INTERRUPT),
    ]
    assert [(a.worker, a.version) for a in advances(actions)] == [("old", 1)]
    assert placed_on(actions) == {"old-r0": "old", "old-r1": "old"}


def test_areal_starts_no_more_rollouts_than_its_concurrency_cap() -> None:
    busy = make_worker("w", version=0, residents=[10, 10, 10])
    fresh = [make_fresh(f"s{i}", group=0) for i in range(5)]
    snap = make_snapshot([busy], fresh=fresh, total_groups=1)
    actions, _ = ArealPolicy(max_concurrent=5).plan(snap, DispatchState())
    assert sorted(placed_on(actions)) == ["s0", "s1"]
    actions, _ = ArealPolicy().plan(snap, DispatchState())
    assert len(placed_on(actions)) == 5
