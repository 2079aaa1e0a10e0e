"""Pending trajectories kept ordered as they depart, return and are placed show exactly
what a snapshot would build from them from scratch."""

from __future__ import annotations

import dataclasses
import random

from cadence.scheduler.pending_index import PendingIndex
from cadence.scheduler.snapshot import PendingTrajectory
from tests.scheduler.factories import make_snapshot


def test_the_index_kept_through_departures_returns_and_placements_equals_a_scratch_build() -> None:
    rng = random.Random(11)
    index = PendingIndex()
    held: dict[str, PendingTrajectory] = {}  # in the order they came, as a dict keeps them
    for n in range(500):
        roll = rng.random()
        if held and roll < 0.35:  # placed
            tid = rng.choice(sorted(held))
            assert index.take(tid) == held.pop(tid)
        elif held and roll < 0.55:  # back from its environment: now placeable
            tid = rng.choice(sorted(held))
            p = held[tid]
            back = PendingTrajectory(tid, p.version, p.context + 30, p.since, True, p.parked_on)
            index.put(back)
            held[tid] = back
        else:  # departed, or left for its environment
            p = PendingTrajectory(
                f"t{n}",
                rng.randint(0, 3),
                rng.choice([100, 250, 250, 900]),
                0.0,
                rng.random() < 0.7,
            )
            index.put(p)
            held[p.id] = p
        expected = make_snapshot([], pending=list(held.values()))
        kept = dataclasses.replace(
            make_snapshot([], pending=list(index)), pending_index=index.order()
        )
        assert list(index) == list(held.values())
        assert dict(kept.pending_by_version) == dict(expected.pending_by_version)
        assert dict(kept.placeable_by_version) == dict(expected.placeable_by_version)
        assert dict(kept.placeable_contexts) == dict(expected.placeable_contexts)
        assert list(kept.pending_by_version) == sorted(kept.pending_by_version)
        assert len(index) == len(held) and all(tid in index for tid in held)


def test_a_version_that_did_not_change_shows_the_same_tuples() -> None:
    index = PendingIndex()
    index.put(PendingTrajectory("a", 1, 50, 0.0))
    index.put(PendingTrajectory("b", 2, 70, 0.0))
    before = index.order()
    index.put(PendingTrajectory("c", 2, 10, 0.0, placeable=False))
    after = index.order()
    assert after.every[1] is before.every[1] and after.placeable[1] is before.placeable[1]
    assert [p.id for p in after.every[2]] == ["c", "b"]
    assert [p.id for p in after.placeable[2]] == ["b"] and after.contexts[2] == (70,)
