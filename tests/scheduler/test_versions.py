"""Version rules: who advances, to which version, and who must stay."""

from __future__ import annotations

from collections.abc import Sequence

from cadence.scheduler import PendingTrajectory, WorkerView, plan

from .factories import make_fresh, make_knobs, make_pending, make_snapshot, make_worker
from .helpers import advances, placed_on


def _advances(
    workers: Sequence[WorkerView],
    pending: Sequence[PendingTrajectory] = (),
    newest: int = 0,
) -> list[tuple[str, int]]:
    actions, _ = plan(make_snapshot(workers, pending=pending, newest=newest))
    return [(a.worker, a.version) for a in advances(actions)]


def test_empty_worker_advances_to_newest_when_nothing_older_needs_a_host() -> None:
    idle = make_worker("idle", version=0)
    assert _advances([idle], newest=3) == [("idle", 3)]


def test_busy_worker_never_advances() -> None:
    busy = make_worker("busy", version=0, residents=[10])
    assert _advances([busy], newest=3) == []


def test_advance_goes_to_oldest_newer_version_with_unhosted_work() -> None:
    idle = make_worker("idle", version=0)
    v3 = make_worker("v3", version=3, residents=[10])
    work = [make_pending("of-v1", 10, version=1), make_pending("of-v2", 10, version=2)]
    assert _advances([idle, v3], work, newest=3) == [("idle", 1)]


def test_advance_never_goes_backwards() -> None:
    idle = make_worker("idle", version=2)
    other = make_worker("other", version=2, residents=[10])
    assert _advances([idle, other], [make_pending("of-v1", 10, version=1)], newest=2) == []


def test_last_host_of_a_version_with_unfinished_work_stays() -> None:
    last = make_worker("last", version=0)
    waits = [make_pending("waits-env", 10, version=0, placeable=False)]
    assert _advances([last], waits, newest=1) == []
    partner = make_worker("partner", version=0)
    # Two empty hosts: one may go, the other stays for version 0's trajectory.
    assert _advances([last, partner], waits, newest=1) == [("last", 1)]


def test_empty_worker_stays_while_its_version_has_placeable_pending_work() -> None:
    idle = make_worker("idle", version=0)
    busy = make_worker("busy", version=0, residents=[900])
    work = [make_pending("resumable", 50, version=0)]
    assert _advances([idle, busy], work, newest=1) == []
    assert _advances([idle, busy], newest=1) == [("idle", 1)]


def test_new_worker_starts_by_the_advance_rule() -> None:
    new = make_worker("new", version=None)
    busy = make_worker("busy", version=2, residents=[10])
    assert _advances([new, busy], [make_pending("of-v1", 10, version=1)], newest=2) == [("new", 1)]
    assert _advances([new], newest=2) == [("new", 2)]


def test_advancing_worker_takes_no_work_in_the_same_cycle() -> None:
    idle = make_worker("idle", version=0)
    snap = make_snapshot(
        [idle],
        fresh=[make_fresh("s", group=1)],
        newest=1,
        knobs=make_knobs(eta=1),
        admitted=2,
        total_groups=2,
    )
    actions, _ = plan(snap)
    assert [(a.worker, a.version) for a in advances(actions)] == [("idle", 1)]
    assert placed_on(actions) == {}


def test_draining_worker_does_not_advance() -> None:
    assert _advances([make_worker("d", version=0, draining=True)], newest=1) == []
