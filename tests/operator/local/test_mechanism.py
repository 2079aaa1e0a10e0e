"""What a run reports of its scheduler: each applied action named as a person reads it
(an eviction's reason; a placement that is fresh, a resume or a move), the role each worker
played, and whether the tail sat on the highest-affinity workers."""

from __future__ import annotations

import dataclasses

from cadence.operator.control.events import events_of
from cadence.operator.local.mechanism import (
    Sample,
    action_counts,
    roles,
    tail_figures,
)
from cadence.scheduler.actions import Action, Advance, Evict, EvictReason, Place
from cadence.worker.api import ResidentInfo, WorkerState
from tests.scheduler.factories import make_pending, make_snapshot, make_worker


def _state(wid: str, affinity: int, version: int, contexts: list[int]) -> WorkerState:
    return WorkerState(
        worker_id=wid,
        accelerator="H800" if affinity == 2 else "A910X",
        affinity=affinity,
        engine="emulated",
        version=version,
        kv_capacity_tokens=3_000 if affinity == 2 else 1_000,
        kv_used_tokens=sum(contexts),
        headroom_tokens=3_000 - sum(contexts),
        residents=[
            ResidentInfo(
                id=f"{wid}-t{i}",
                attempt=0,
                version=version,
                context=c,
                generated=c - 10,
                decoded_since_placement=c - 10,
                state="decoding",
            )
            for i, c in enumerate(contexts)
        ],
        parked=[],
        draining=False,
    )


def test_a_placement_is_a_move_only_when_the_trajectory_left_another_worker() -> None:
    parked_here = dataclasses.replace(make_pending("back", 300), parked_on="w1")
    snapshot = make_snapshot(
        [make_worker("w0", residents=[400]), make_worker("w1")],
        pending=[parked_here, make_pending("loose", 50)],
    )
    plan: list[Action] = [
        Evict("w0-r0", "w0", 400, EvictReason.FLOOR),
        Place("w0-r0", "w1", 0, 400),  # left w0 in this same plan
        Place("back", "w1", 0, 300),  # parked on w1, placed on w1
        Place("new", "w0", 0, 10),  # a fresh sample
        Advance("w0", 1),
    ]
    events = events_of(snapshot, plan, at=2.5)
    assert [(e.kind, e.worker, e.detail) for e in events] == [
        ("evict", "w0", "floor"),
        ("place", "w1", "move"),
        ("place", "w1", "resume"),
        ("place", "w0", "fresh"),
        ("advance", "w0", "1"),
    ]
    assert {e.at for e in events} == {2.5}
    counts = action_counts({(e.kind, e.detail): 1 for e in events})
    assert counts["evictions_by_reason"] == {"floor": 1}
    assert counts["placements_by_kind"] == {"fresh": 1, "resume": 1, "move": 1}


def test_workers_left_on_an_old_version_with_residents_are_the_tail() -> None:
    timeline = [
        Sample(0.0, {"h": _state("h", 2, 0, [100, 90]), "a": _state("a", 1, 0, [80])}),
        # a emptied and advanced: it takes fresh work; h finishes version 0's long tail
        Sample(1.0, {"h": _state("h", 2, 0, [400, 350]), "a": _state("a", 1, 1, [20, 20])}),
        Sample(3.0, {"h": _state("h", 2, 0, [500]), "a": _state("a", 1, 1, [])}),
        Sample(4.0, {"h": _state("h", 2, 1, [30]), "a": _state("a", 1, 1, [30])}),
    ]
    assert roles(timeline) == {
        "a": {"throughput": 3.0, "tail": 0.0, "idle": 1.0},
        "h": {"throughput": 1.0, "tail": 3.0, "idle": 0.0},
    }
    figures = tail_figures(timeline)
    assert figures["tail_resident_cycles"] == 3
    assert figures["tail_top_affinity_share"] == 1.0
    assert figures["top_affinity_kv_share"] == 0.75


def test_a_pool_that_advances_together_has_no_tail() -> None:
    timeline = [
        Sample(float(t), {"h": _state("h", 2, t, [100]), "a": _state("a", 1, t, [900])})
        for t in range(3)
    ]
    assert tail_figures(timeline)["tail_top_affinity_share"] is None
    assert all(r["tail"] == 0.0 for r in roles(timeline).values())
