"""The loop's garbage collection between cycles: the oldest generation is never
collected mid-cycle, and is collected after one when due and the period allows."""

from __future__ import annotations

import gc

from cadence.operator.control.idle_gc import IdleCollector, collecting_between_cycles


def _full_collections() -> int:
    return int(gc.get_stats()[2]["collections"])


def _young_collections(n: int) -> None:
    """Make the oldest generation n young collections overdue."""
    for _ in range(n):
        gc.collect(1)


def test_the_oldest_generation_waits_while_loops_run_and_thresholds_come_back() -> None:
    before = gc.get_threshold()
    with collecting_between_cycles():
        with collecting_between_cycles():  # a second loop in the same process
            assert gc.get_threshold()[:2] == before[:2]  # the young ones stay automatic
            full = _full_collections()
            _young_collections(before[2] + 5)  # past the point CPython would collect it
            garbage: list[list[int]] = [[] for _ in range(10 * before[0])]  # triggers it
            del garbage
            assert _full_collections() == full
        assert gc.get_threshold()[2] != before[2]  # the other loop still runs
    assert gc.get_threshold() == before


def test_collects_when_due_and_the_idle_time_allows() -> None:
    with collecting_between_cycles():
        gc.collect()
        collector = IdleCollector(due=3, overdue=6)
        _young_collections(2)
        full = _full_collections()
        assert collector.after_cycle(idle_s=10.0) == 0.0
        assert _full_collections() == full  # not due yet
        _young_collections(1)
        assert collector.after_cycle(idle_s=10.0) > 0.0
        assert _full_collections() == full + 1
        assert gc.get_count()[2] == 0


def test_waits_for_a_roomier_period_until_overdue() -> None:
    with collecting_between_cycles():
        gc.collect()
        collector = IdleCollector(due=3, overdue=6, last_ms=500.0)
        full = _full_collections()
        _young_collections(3)
        assert collector.after_cycle(idle_s=0.2) == 0.0  # 500 ms would not fit in 200
        assert _full_collections() == full
        _young_collections(3)
        collector.after_cycle(idle_s=0.2)  # overdue: collected whatever the time
        assert _full_collections() == full + 1
