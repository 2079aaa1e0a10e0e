"""Sync and One-off (verl): dispatch by fewest assigned, batches gated by staleness."""

from __future__ import annotations

from cadence.scheduler.baselines.sync import DispatchState, one_off, sync

from ..factories import make_fresh, make_knobs, make_pending, make_snapshot, make_worker
from ..helpers import admitted, advances, evictions, placed_on


def test_sync_admits_the_next_batch_only_when_idle_and_trained() -> None:
    idle = [make_worker("a", version=1), make_worker("b", version=1)]
    snap = make_snapshot(idle, newest=1, admitted=4, batch_size=4, total_groups=12)
    actions, _ = sync().plan(snap, DispatchState())
    assert admitted(actions) == 4
    # Batch 0 done, version 1 not yet published: Sync waits, One-off starts batch 1.
    idle0 = [make_worker("a", version=0), make_worker("b", version=0)]
    snap = make_snapshot(idle0, newest=0, admitted=4, batch_size=4, total_groups=12)
    assert admitted(sync().plan(snap, DispatchState())[0]) == 0
    assert admitted(one_off().plan(snap, DispatchState())[0]) == 4
    # Batch 1 done too: batch 2 would need version 1 even for One-off.
    snap = make_snapshot(
        idle0, newest=0, admitted=8, batch_size=4, total_groups=12, knobs=make_knobs(eta=1)
    )
    assert admitted(one_off().plan(snap, DispatchState())[0]) == 0


def test_busy_pool_gets_no_new_batch_and_no_weights() -> None:
    busy = [make_worker("a", version=0, residents=[100]), make_worker("b", version=0)]
    snap = make_snapshot(busy, newest=1, admitted=4, batch_size=4, total_groups=12)
    actions, _ = one_off().plan(snap, DispatchState())
    assert admitted(actions) == 0
    assert advances(actions) == []


def test_fresh_samples_go_to_the_fewest_assigned_and_returns_stick() -> None:
    workers = [make_worker("a", version=0, residents=[10]), make_worker("b", version=0)]
    fresh = [make_fresh(f"s{i}", group=0) for i in range(5)]
    back = make_pending("tool", 50, version=0)
    back = type(back)(back.id, back.version, back.context, back.since, True, "a")
    snap = make_snapshot(workers, pending=[back], fresh=fresh, batch_size=1, total_groups=1)
    actions, state = sync().plan(snap, DispatchState({"a": 3}))
    placed = placed_on(actions)
    assert placed.pop("tool") == "a"
    assert sorted(placed.values()) == ["a", "b", "b", "b", "b"]
    assert state.assigned == {"a": 4, "b": 4}
    assert evictions(actions) == []
