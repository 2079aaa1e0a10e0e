"""The move rule (moves.py) and how the Cadence policy follows it: a KV pull is preferred
among equally tight targets, migration kv never crosses transfer groups while the
source's group serves the version, and nothing is stranded when it does not."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest

from cadence.scheduler import Action, Evict, Place, plan
from cadence.scheduler.concentration import concentrate
from cadence.scheduler.lift import worth_moving
from cadence.scheduler.moves import MoveRule, move_cost_s, move_kind
from cadence.scheduler.snapshot import (
    Migration,
    PendingTrajectory,
    Snapshot,
    Transfer,
    WorkerView,
)
from cadence.scheduler.working import WorkingWorker
from tests.scheduler.factories import (
    make_cost,
    make_knobs,
    make_snapshot,
    make_worker,
)


def grouped(worker: WorkerView, group: str | None) -> WorkerView:
    return replace(worker, transfer_group=group)


def parked(id: str, context: int, on: str | None, version: int = 0) -> PendingTrajectory:
    return PendingTrajectory(id, version, context, 0.0, parked_on=on)


def placements(actions: Sequence[Action]) -> dict[str, str]:
    return {a.trajectory: a.worker for a in actions if isinstance(a, Place)}


def test_move_kind_follows_groups_and_the_knob() -> None:
    assert move_kind("auto", "s", "A", "d", "A") == "kv"
    assert move_kind("kv", "s", "A", "d", "A") == "kv"
    assert move_kind("reprefill", "s", "A", "d", "A") == "reprefill"
    assert move_kind("auto", "s", "A", "d", "B") == "reprefill"
    assert move_kind("auto", "s", None, "d", None) == "reprefill"
    assert move_kind("auto", None, "A", "d", "A") == "reprefill"
    assert move_kind("auto", "s", "A", "s", "A") == "local"


def test_move_cost_is_a_pull_over_the_link_or_a_prefill_on_the_destination() -> None:
    link = Transfer(kv_bytes_per_token=1_000.0, link_bytes_per_s=1e6)
    assert move_cost_s("kv", 2_000, None, link) == pytest.approx(2.0)
    assert move_cost_s("kv", 2_000, None, None) == 0.0
    prefill = make_cost(prefill_token_us=100.0)
    assert move_cost_s("reprefill", 2_000, prefill, link) == pytest.approx(0.2)
    assert move_cost_s("reprefill", 2_000, None, link) == math.inf
    assert move_cost_s("reprefill", 2_000, make_cost(), link) == math.inf


def test_transfer_refuses_a_link_of_no_speed() -> None:
    with pytest.raises(ValueError, match="link_bytes_per_s"):
        Transfer(kv_bytes_per_token=1.0, link_bytes_per_s=0.0)


def _pacing_pool(migration: Migration, source_alive: bool = True) -> Snapshot:
    """A trajectory parked on `src` (group A, draining); two equally roomy targets, `a-w`
    in group B (first by id) and `b-w` in group A; `full-a`, group A, serves version 0
    with no room, unless the source's group is gone."""
    workers = [
        grouped(make_worker("src", capacity=1_000, draining=True), "A"),
        grouped(make_worker("a-w", capacity=1_000), "B"),
        grouped(make_worker("b-w", capacity=1_000), "A"),
    ]
    if source_alive:
        workers.append(grouped(make_worker("full-a", capacity=1_000, residents=[990]), "A"))
    return make_snapshot(
        workers, pending=[parked("p", 300, "src")], knobs=make_knobs(migration=migration)
    )


def test_kv_capable_target_is_preferred_among_equally_tight() -> None:
    actions, _ = plan(_pacing_pool("auto"))
    assert placements(actions)["p"] == "b-w"


def test_without_pulls_equally_tight_targets_go_by_id() -> None:
    actions, _ = plan(_pacing_pool("reprefill"))
    assert placements(actions)["p"] == "a-w"


def test_kv_never_crosses_groups_while_the_source_group_serves_the_version() -> None:
    snapshot = _pacing_pool("kv")
    # Only the B worker has room: kv waits for the A group rather than re-prefill.
    workers = tuple(
        grouped(make_worker("b-w", capacity=1_000, residents=[900]), "A") if w.id == "b-w" else w
        for w in snapshot.workers
    )
    actions, _ = plan(replace(snapshot, workers=workers))
    assert "p" not in placements(actions)
    auto = replace(snapshot, workers=workers, knobs=make_knobs(migration="auto"))
    actions, _ = plan(auto)
    assert placements(actions)["p"] == "a-w"


def test_kv_allows_a_reprefill_when_the_source_is_gone() -> None:
    snapshot = make_snapshot(
        [grouped(make_worker("a-w", capacity=1_000), "B")],
        pending=[parked("p", 300, "vanished")],
        knobs=make_knobs(migration="kv"),
    )
    actions, _ = plan(snapshot)
    assert placements(actions) == {"p": "a-w"}


def test_kv_allows_a_reprefill_when_no_worker_of_the_group_serves_the_version() -> None:
    snapshot = _pacing_pool("kv", source_alive=False)
    workers = tuple(
        grouped(make_worker("b-w", capacity=1_000, version=1), "A") if w.id == "b-w" else w
        for w in snapshot.workers
    )
    actions, _ = plan(replace(snapshot, workers=workers, newest_version=1))
    assert placements(actions)["p"] == "a-w"


def _concentration_targets(migration: Migration) -> tuple[Snapshot, list[WorkingWorker]]:
    """Version 0's tail: `fast` (rank 2, group B) and `slow` (rank 1, group A) targets."""
    knobs = make_knobs(migration=migration)
    src = grouped(make_worker("src", capacity=1_000, affinity=0), "A")
    fast = grouped(make_worker("fast", capacity=1_000, affinity=2), "B")
    slow = grouped(make_worker("slow", capacity=1_000, affinity=1), "A")
    snapshot = make_snapshot([src, fast, slow], knobs=knobs)
    return snapshot, [WorkingWorker(fast, knobs), WorkingWorker(slow, knobs)]


@pytest.mark.parametrize(("migration", "target"), [("auto", "fast"), ("kv", "slow")])
def test_concentration_under_kv_keeps_a_departure_in_its_group(
    migration: Migration, target: str
) -> None:
    snapshot, targets = _concentration_targets(migration)
    p = parked("p", 400, "src")
    rule = MoveRule(snapshot, [w.view for w in targets])
    assert _concentrated(targets, p, rule) == {"p": target}


def test_concentration_prefers_the_pull_between_equal_targets() -> None:
    knobs = make_knobs()
    src = grouped(make_worker("src", capacity=1_000), "A")
    views = [
        grouped(make_worker("a-other", capacity=1_000, affinity=1), "B"),
        grouped(make_worker("b-same", capacity=1_000, affinity=1), "A"),
    ]
    snapshot = make_snapshot([src, *views], knobs=knobs)
    p = parked("p", 400, "src")
    for rule, expected in ((MoveRule(snapshot, views), "b-same"), (None, "a-other")):
        targets = [WorkingWorker(v, knobs) for v in views]
        assert _concentrated(targets, p, rule) == {"p": expected}


def _concentrated(
    targets: list[WorkingWorker], p: PendingTrajectory, rule: MoveRule | None
) -> dict[str, str]:
    """Where concentration places `p` (its only candidate) among `targets`."""
    out: list[Action] = []
    concentrate(None, targets, [([p], [p.context])], min_decode=1, out=out, moves=rule)
    return placements(out)


def test_a_pull_is_worth_a_lift_that_a_reprefill_is_not() -> None:
    """Saved: 1,000 tokens x 10 ms = 10 s. A re-prefill of 10,000 tokens at 100 us a token
    is 1 s, times the target's 20 residents plus the moved one: 21 s, not worth it; a pull
    of the same context at 1 MB/s of 100 bytes a token is 1 s, and delays only the mover."""
    knobs = make_knobs()
    slow_cost = make_cost(weights_ms=20.0, prefill_token_us=100.0)
    fast_cost = make_cost(weights_ms=10.0, prefill_token_us=100.0)
    source = WorkingWorker(
        grouped(make_worker("s", capacity=100_000, residents=[10_000], cost=slow_cost), "A"),
        knobs,
    )
    target = WorkingWorker(
        grouped(
            make_worker("t", capacity=1_000_000, residents=[100] * 20, cost=fast_cost, affinity=1),
            "A",
        ),
        knobs,
    )
    snapshot = replace(
        make_snapshot([source.view, target.view], knobs=knobs),
        transfer=Transfer(kv_bytes_per_token=100.0, link_bytes_per_s=1e6),
    )
    rule = MoveRule(snapshot)
    pull = rule.between(10_000, source.view, target.view)
    assert pull.kind == "kv" and pull.seconds == pytest.approx(1.0)
    assert worth_moving(10_000, 1_000, source, target, 1.0, move=pull)
    no_pull = MoveRule(replace(snapshot, knobs=make_knobs(migration="reprefill")))
    reprefill = no_pull.between(10_000, source.view, target.view)
    assert reprefill.kind == "reprefill"
    assert not worth_moving(10_000, 1_000, source, target, 1.0, move=reprefill)


def test_kv_restricts_only_while_a_host_of_the_group_serves_the_version() -> None:
    snapshot = _pacing_pool("kv")
    rule = MoveRule(snapshot)
    p = snapshot.pending[0]
    assert rule.restriction(p) == "A"
    by_id = {w.id: w for w in snapshot.workers}
    assert rule.allowed(p, by_id["b-w"]) and not rule.allowed(p, by_id["a-w"])
    assert MoveRule(snapshot, [by_id["a-w"]]).restriction(p) is None
    assert MoveRule(replace(snapshot, knobs=make_knobs(migration="auto"))).restriction(p) is None


def test_lift_under_kv_stays_in_its_group() -> None:
    """Work conservation moves the tail up to faster workers; under kv only within the
    source's group."""
    cost_slow = make_cost(weights_ms=50.0)
    cost_fast = make_cost(weights_ms=5.0)
    slow = grouped(make_worker("slow", capacity=100_000, residents=[5_000], cost=cost_slow), "A")
    fast = grouped(
        make_worker("fast", capacity=100_000, affinity=1, cost=cost_fast),
        "B",
    )
    for migration, moved in (("auto", True), ("kv", False)):
        snapshot = make_snapshot([slow, fast], knobs=make_knobs(migration=migration))
        actions, _ = plan(snapshot)
        evicted = [a for a in actions if isinstance(a, Evict)]
        assert bool(evicted) is moved, migration
