"""Admission under eta, and exhaustion of a version's short end."""

from __future__ import annotations

import pytest

from cadence.scheduler import plan
from cadence.scheduler.admission import ShortEnd, groups_to_admit, may_start

from .factories import make_fresh, make_knobs, make_snapshot, make_worker
from .helpers import admitted


@pytest.mark.parametrize(
    ("newest", "eta", "already", "expected"),
    [
        (0, 0, 0, 4),  # eta = 0: only batch 0 (synchronous)
        (0, 0, 4, 0),
        (0, 1, 0, 8),  # batches 0 and 1
        (2, 1, 8, 8),  # limit (2 + 1 + 1) * 4 = 16
        (5, 3, 20, 4),  # limit 36 capped by the total of 24
    ],
)
def test_admits_exactly_what_the_staleness_bound_allows(
    newest: int, eta: int, already: int, expected: int
) -> None:
    snap = make_snapshot(
        [make_worker("w")],
        newest=newest,
        knobs=make_knobs(eta=eta),
        admitted=already,
        batch_size=4,
        total_groups=24,
    )
    assert groups_to_admit(snap) == expected
    assert admitted(plan(snap)[0]) == expected


def test_may_start_only_on_versions_at_least_batch_minus_eta() -> None:
    assert may_start(batch=3, version=2, eta=1)
    assert not may_start(batch=3, version=1, eta=1)
    assert may_start(batch=0, version=0, eta=0)


def _short_end(fresh_groups: list[int], admitted: int, total: int) -> ShortEnd:
    snap = make_snapshot(
        [make_worker("w")],
        fresh=[make_fresh(f"s{g}", group=g) for g in fresh_groups],
        newest=1,
        knobs=make_knobs(eta=1),
        admitted=admitted,
        batch_size=2,
        total_groups=total,
    )
    return ShortEnd(snap)


def test_exhausted_reads_waiting_and_admissible_groups() -> None:
    # Group 3 (batch 1) waiting: version 0 may still start it (B = 2, eta = 1).
    assert not _short_end([3], admitted=6, total=6).exhausted(0)
    # Only group 4 (batch 2) waiting: too new for version 0, fine for version 1.
    short_end = _short_end([4], admitted=6, total=6)
    assert short_end.exhausted(0)
    assert not short_end.exhausted(1)
    # Nothing waiting, but groups 4 and 5 (batch 2) admissible now: they cannot reach
    # version 0, so it is exhausted; version 1 is not.
    short_end = _short_end([], admitted=4, total=10)
    assert short_end.exhausted(0)
    assert not short_end.exhausted(1)
    assert short_end.newer_has_fresh(0, newest=1)
    # Everything admitted and started: every version is exhausted, nothing is fresh.
    short_end = _short_end([], admitted=10, total=10)
    assert short_end.exhausted(1)
    assert not short_end.newer_has_fresh(0, newest=1)
