"""What a snapshot normalises on construction, so every builder hands policies the same."""

from __future__ import annotations

from cadence.scheduler.snapshot import worker_order

from .factories import make_snapshot, make_worker


def test_workers_are_listed_by_name_then_ordinal_whoever_built_the_snapshot() -> None:
    ids = ["h800-10", "a910x-1", "h800-2", "mixed-h800-0", "a910x-0", "odd"]
    snapshot = make_snapshot([make_worker(i) for i in ids])
    assert [w.id for w in snapshot.workers] == [
        "a910x-0",
        "a910x-1",
        "h800-2",
        "h800-10",
        "mixed-h800-0",
        "odd",
    ]
    assert worker_order("h800-2") < worker_order("h800-10")
