"""Admission under eta, and exhaustion of a version's short end."""

from __future__ import annotations

import pytest

from cadence.operator.scheduler import plan
from cadence.operator.scheduler.admission import ShortEnd, groups_to_admit, may_start

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


def test_exhausted_reads_waiting_and_admissible_groups() -> None:
    base = {"workers": [make_worker("w")], "knobs": make_knobs(eta=1), "batch_size": 2}
    # Group 3 (batch 1) waiting: version 0 may still start it.
    snap = make_snapshot(
        fresh=[make_fresh("s", group=3)], newest=1, admitted=6, total_groups=6, **base
    )  # type: ignore[arg-type]
    assert not ShortEnd(snap).exhausted(0)
    # Only group 4 (batch 2) waiting: too new for version 0, fine for version 1.
    snap = make_snapshot(
        fresh=[make_fresh("s", group=4)], newest=1, admitted=6, total_groups=6, **base
    )  # type: ignore[arg-type]
    assert ShortEnd(snap).exhausted(0)
    assert not ShortEnd(snap).exhausted(1)
    # Nothing waiting, but groups 4 and 5 (batch 2) admissible now: they cannot reach
    # version 0, so it is exhausted; version 1 is not.
    snap = make_snapshot(newest=1, admitted=4, total_groups=10, **base)  # type: ignore[arg-type]
    assert groups_to_admit(snap) == 2
    assert ShortEnd(snap).exhausted(0)
    assert not ShortEnd(snap).exhausted(1)
    assert ShortEnd(snap).newer_has_fresh(0, newest=1)
