"""DORA-like: versions get workers by demand; a moved worker's requests stay on their
version; new work goes to the newest version first."""

from __future__ import annotations

from cadence.scheduler import EvictReason
from cadence.scheduler.baselines.dora import DoraPolicy

from ..factories import make_fresh, make_knobs, make_snapshot, make_worker
from ..helpers import advances, evictions, placed_on


def test_surplus_old_worker_moves_to_the_newest_and_its_requests_stay_on_their_version() -> None:
    old_a = make_worker("old-a", version=0, capacity=1000, residents=[100])
    old_b = make_worker("old-b", version=0, capacity=1000, residents=[50])
    new = make_worker("new", version=1, capacity=1000)
    fresh = [make_fresh(f"s{i}", group=2) for i in range(6)]
    snap = make_snapshot(
        [old_a, old_b, new],
        fresh=fresh,
        newest=1,
        knobs=make_knobs(eta=1),
        admitted=3,
        total_groups=3,
    )
    actions, _ = DoraPolicy().plan(snap, DoraPolicy().initial_state())
    # Demand: version 0 has 2 requests, version 1 has 6 fresh: 3 workers -> 1 and 2.
    assert [(a.worker, a.version) for a in advances(actions)] == [("old-b", 1)]
    assert [(e.trajectory, e.reason) for e in evictions(actions)] == [
        ("old-b-r0", EvictReason.REPACK)
    ]
    placed = placed_on(actions)
    assert placed.pop("old-b-r0") == "old-a"
    assert set(placed.values()) == {"new"}  # old-b is loading weights this cycle
