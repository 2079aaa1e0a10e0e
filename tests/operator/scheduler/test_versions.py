"""Version rules: who advances, to which version, and who must stay."""

from __future__ import annotations

from cadence.operator.scheduler import plan

from .factories import make_fresh, make_knobs, make_pending, make_snapshot, make_worker
from .helpers import advances, placed_on


def _advances(snap_kwargs: dict[str, object]) -> list[tuple[str, int]]:
    actions, _ = plan(make_snapshot(**snap_kwargs))  # type: ignore[arg-type]
    return [(a.worker, a.version) for a in advances(actions)]


def test_empty_worker_advances_to_newest_when_nothing_older_needs_a_host() -> None:
    idle = make_worker("idle", version=0)
    assert _advances({"workers": [idle], "newest": 3}) == [("idle", 3)]


def test_busy_worker_never_advances() -> None:
    busy = make_worker("busy", version=0, residents=[10])
    assert _advances({"workers": [busy], "newest": 3}) == []


def test_advance_goes_to_oldest_newer_version_with_unhosted_work() -> None:
    idle = make_worker("idle", version=0)
    v3 = make_worker("v3", version=3, residents=[10])
    work = [make_pending("of-v1", 10, version=1), make_pending("of-v2", 10, version=2)]
    kw = {"workers": [idle, v3], "pending": work, "newest": 3}
    assert _advances(kw) == [("idle", 1)]


def test_advance_never_goes_backwards() -> None:
    idle = make_worker("idle", version=2)
    other = make_worker("other", version=2, residents=[10])
    kw = {"workers": [idle, other], "pending": [make_pending("of-v1", 10, version=1)], "newest": 2}
    assert _advances(kw) == []


def test_last_host_of_a_version_with_unfinished_work_stays() -> None:
    last = make_worker("last", version=0)
    kw = {
        "workers": [last],
        "pending": [make_pending("waits-env", 10, version=0, placeable=False)],
        "newest": 1,
    }
    assert _advances(kw) == []
    partner = make_worker("partner", version=0)
    kw["workers"] = [last, partner]
    # Two empty hosts: one may go, the other stays for version 0's trajectory.
    assert _advances(kw) == [("last", 1)]


def test_new_worker_starts_by_the_advance_rule() -> None:
    new = make_worker("new", version=None)
    busy = make_worker("busy", version=2, residents=[10])
    kw = {"workers": [new, busy], "pending": [make_pending("of-v1", 10, version=1)], "newest": 2}
    assert _advances(kw) == [("new", 1)]
    assert _advances({"workers": [new], "newest": 2}) == [("new", 2)]


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
    assert _advances({"workers": [make_worker("d", version=0, draining=True)], "newest": 1}) == []
