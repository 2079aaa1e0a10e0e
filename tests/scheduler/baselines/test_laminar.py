"""Laminar-like: replicas take prompts when drained, repack moves a draining replica whole."""

from __future__ import annotations

from types import MappingProxyType

from cadence.scheduler import EvictReason
from cadence.scheduler.baselines.laminar import LaminarPolicy, LaminarState

from ..factories import make_fresh, make_pending, make_snapshot, make_worker
from ..helpers import admitted, advances, evictions, placed_on


def test_a_drained_replica_pulls_weights_then_takes_prompts_for_itself() -> None:
    policy = LaminarPolicy(prompts_per_take=2)
    stale = make_worker("stale", version=0)
    ready = make_worker("ready", version=1)
    snap = make_snapshot([stale, ready], newest=1, admitted=0, batch_size=4, total_groups=8)
    actions, state = policy.plan(snap, policy.initial_state())
    assert [(a.worker, a.version) for a in advances(actions)] == [("stale", 1)]
    assert admitted(actions) == 2
    assert dict(state.claims) == {0: "ready", 1: "ready"}
    # Next cycle the admitted samples go to the replica that took them.
    fresh = [make_fresh("g0s0", group=0), make_fresh("g1s0", group=1)]
    snap = make_snapshot(
        [stale, ready], fresh=fresh, newest=1, admitted=2, batch_size=4, total_groups=8
    )
    actions, _ = policy.plan(snap, state)
    assert placed_on(actions) == {"g0s0": "ready", "g1s0": "ready"}


def test_repack_moves_a_falling_replica_onto_the_fullest_that_fits() -> None:
    policy = LaminarPolicy(decode_batch_bound=8, kv_cap=0.9)
    small = make_worker("small", capacity=1000, residents=[100, 50], version=0)
    full = make_worker("full", capacity=1000, residents=[600], version=0)
    roomy = make_worker("roomy", capacity=1000, residents=[200], version=0)
    peaks = MappingProxyType({"small": 400, "full": 600, "roomy": 200})
    state = LaminarState(peak_kv=peaks)
    snap = make_snapshot([small, full, roomy], newest=0, now=10.0)
    actions, _ = policy.plan(snap, state)
    assert {e.reason for e in evictions(actions)} == {EvictReason.REPACK}
    assert placed_on(actions) == {"small-r0": "full", "small-r1": "full"}


def test_a_replica_with_a_trajectory_at_its_tool_has_not_drained() -> None:
    policy = LaminarPolicy()
    stale = make_worker("stale", version=0)
    waiting = make_pending("at-tool", 300, version=0, placeable=False)
    waiting = type(waiting)(waiting.id, 0, 300, 0.0, False, "stale")
    snap = make_snapshot(
        [stale], pending=[waiting], newest=1, admitted=0, batch_size=4, total_groups=8
    )
    actions, _ = policy.plan(snap, policy.initial_state())
    assert advances(actions) == []
    assert admitted(actions) == 0
