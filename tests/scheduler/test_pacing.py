"""Pacing rules: floor eviction longest first, tight-fit placement shortest first."""

from __future__ import annotations

from collections import Counter

import pytest

from cadence.scheduler import CadencePolicy, CadenceState, EvictReason, FreshSample, plan
from cadence.scheduler.errors import ConfigError
from cadence.scheduler.snapshot import Snapshot

from .factories import (
    make_cost,
    make_fresh,
    make_knobs,
    make_pending,
    make_resident,
    make_snapshot,
    make_worker,
)
from .helpers import evicted_from, evictions, placed_on, placements


def test_figure_8_story() -> None:
    """The paper's Figure 8: (a) worker 1 sheds its longest resident at the floor;
    (b) trajectory 7 fits both workers and goes to worker 1, the tighter one;
    (c) trajectory 2 would break worker 1's placement threshold and goes to worker 2;
    trajectory 3 fits nowhere and stays pending."""
    w1 = make_worker("w1", capacity=1000, residents=[500, 300, 150])  # H = 50 < h_min
    w2 = make_worker("w2", capacity=1000, residents=[400])  # H = 600
    snap = make_snapshot(
        [w1, w2],
        pending=[make_pending("t7", 100), make_pending("t2", 250), make_pending("t3", 600)],
        knobs=make_knobs(h_min=100, delta=50),
    )
    actions, _ = plan(snap)
    assert evicted_from(actions) == [("w1-r0", "w1")]
    assert placed_on(actions) == {"t7": "w1", "t2": "w2"}


def test_floor_evicts_longest_until_restored() -> None:
    w = make_worker("w", capacity=1000, residents=[100, 400, 300, 150])  # H = 50
    actions, _ = plan(make_snapshot([w], knobs=make_knobs(h_min=500)))
    # 400 out -> H 450, still < 500; 300 out -> H 750.
    assert [(e.context, e.reason) for e in evictions(actions)] == [
        (400, EvictReason.FLOOR),
        (300, EvictReason.FLOOR),
    ]


def test_floor_eviction_respects_anti_thrash_minimum() -> None:
    fresh_long = make_resident("just-placed", 600, decoded=3)
    old_short = make_resident("old", 300, decoded=500)
    w = make_worker("w", capacity=1000, residents=[fresh_long, old_short])  # H = 100
    actions, _ = plan(make_snapshot([w], knobs=make_knobs(h_min=200, min_decode=64)))
    assert evicted_from(actions) == [("old", "w")]


def test_no_eviction_above_floor() -> None:
    w = make_worker("w", capacity=1000, residents=[500, 300])  # H = 200
    actions, _ = plan(make_snapshot([w], knobs=make_knobs(h_min=200)))
    assert evictions(actions) == []


def test_threshold_counts_the_incoming_trajectory_in_the_reserve() -> None:
    # H = 600, one resident: placing c needs 600 - c >= 100 + 50 * 2 = 200, so c <= 400.
    w = make_worker("w", capacity=1000, residents=[400])
    snap = make_snapshot(
        [w],
        pending=[make_pending("fits", 400), make_pending("too-big", 401)],
        knobs=make_knobs(h_min=100, delta=50),
    )
    assert placed_on(plan(snap)[0]) == {"fits": "w"}
    snap = make_snapshot(
        [w], pending=[make_pending("too-big", 401)], knobs=make_knobs(h_min=100, delta=50)
    )
    assert placed_on(plan(snap)[0]) == {}


def test_shortest_first_keeps_the_large_gap_for_long_work() -> None:
    tight = make_worker("tight", capacity=1000, residents=[700])  # H = 300
    roomy = make_worker("roomy", capacity=1000, residents=[100])  # H = 900
    snap = make_snapshot(
        [tight, roomy],
        pending=[make_pending("long", 800), make_pending("short", 200)],
    )
    assert placed_on(plan(snap)[0]) == {"short": "tight", "long": "roomy"}


def test_worst_fit_ablation_spreads_short_work() -> None:
    tight = make_worker("tight", capacity=1000, residents=[700])
    roomy = make_worker("roomy", capacity=1000, residents=[100])
    snap = make_snapshot([tight, roomy], pending=[make_pending("short", 200)])
    actions, _ = CadencePolicy(fit="worst").plan(snap, CadenceState())
    assert placed_on(actions) == {"short": "roomy"}


def test_departed_work_goes_before_new_work_competing_for_the_same_gap() -> None:
    """The cycle places P_v into the gaps before starting fresh samples, so a departed
    trajectory does not wait behind a version's whole short end; the merged order (the
    ablation) lets the shorter fresh samples take the gap first."""
    w = make_worker("w", capacity=1000, residents=[500])  # H = 500
    snap = make_snapshot(
        [w],
        pending=[make_pending("departed", 400)],
        fresh=[make_fresh(f"f{i}", prompt=100) for i in range(4)],
        admitted=1,
        total_groups=1,
    )
    assert placed_on(plan(snap)[0]) == {"departed": "w", "f0": "w"}
    merged, _ = CadencePolicy(fresh="merged").plan(snap, CadenceState())
    assert placed_on(merged) == {f"f{i}": "w" for i in range(4)}


def test_pending_resumes_only_on_its_own_version() -> None:
    old = make_worker("old", version=0, residents=[100])
    new = make_worker("new", version=1, residents=[900])
    snap = make_snapshot([old, new], pending=[make_pending("t", 50, version=1)], newest=1)
    assert placed_on(plan(snap)[0]) == {"t": "new"}
    snap = make_snapshot([old], pending=[make_pending("t", 50, version=1)], newest=1)
    assert placed_on(plan(snap)[0]) == {}


def test_trajectory_waiting_for_environment_is_not_placed() -> None:
    w = make_worker("w")
    snap = make_snapshot([w], pending=[make_pending("t", 50, placeable=False)])
    assert placed_on(plan(snap)[0]) == {}


def test_departed_trajectory_is_placed_in_the_same_cycle() -> None:
    busy = make_worker("busy", capacity=1000, residents=[600, 390])  # H = 10
    idle = make_worker("idle", capacity=1000, residents=[50])
    snap = make_snapshot([busy, idle], knobs=make_knobs(h_min=100, delta=10))
    actions, _ = plan(snap)
    assert evicted_from(actions) == [("busy-r0", "busy")]
    assert placed_on(actions) == {"busy-r0": "idle"}


def test_fresh_sample_binds_only_within_eta() -> None:
    # Batch 2 (group 2, B = 1) with eta = 1 may start on versions >= 1 only.
    v0 = make_worker("v0", version=0, residents=[500])
    v1 = make_worker("v1", version=1, residents=[100])
    snap = make_snapshot(
        [v0, v1],
        fresh=[make_fresh("s", group=2)],
        newest=1,
        knobs=make_knobs(eta=1),
        admitted=3,
        total_groups=3,
    )
    actions, _ = plan(snap)
    assert [(p.worker, p.version) for p in placements(actions) if p.trajectory == "s"] == [
        ("v1", 1)
    ]


def test_fresh_sample_goes_to_the_tightest_worker_of_any_allowed_version() -> None:
    v0 = make_worker("v0", version=0, residents=[800])
    v1 = make_worker("v1", version=1, residents=[100])
    snap = make_snapshot(
        [v0, v1],
        fresh=[make_fresh("s", group=1)],
        newest=1,
        knobs=make_knobs(eta=1),
        admitted=2,
        total_groups=2,
    )
    assert placed_on(plan(snap)[0]) == {"s": "v0"}


def _two_open_batches() -> Snapshot:
    """Batches 0 and 1 open (B = 1, eta = 1) and one worker with two seats: batch 1 has
    two samples, batch 0 one whose prompt is the longer and whose id sorts last."""
    worker = make_worker("w", capacity=50_000, max_seqs=2)
    fresh = [
        make_fresh("a", group=1),
        make_fresh("b", group=1),
        make_fresh("z", group=0, prompt=20),
    ]
    return make_snapshot([worker], fresh=fresh, knobs=make_knobs(eta=1), admitted=2, total_groups=3)


def test_fresh_samples_of_the_oldest_batch_start_first() -> None:
    # The trainer needs all of batch 0 before it can publish the version batch 2 waits
    # on, so batch 0's sample starts although it is the longer and its id sorts last.
    assert sorted(placed_on(plan(_two_open_batches())[0])) == ["a", "z"]


def test_the_ablations_merge_batches_shortest_first() -> None:
    snap = _two_open_batches()
    for literal in (CadencePolicy(fresh="merged"), CadencePolicy(batches="mixed")):
        assert sorted(placed_on(literal.plan(snap, CadenceState())[0])) == ["a", "b"]


def test_an_unknown_batch_order_is_refused() -> None:
    with pytest.raises(ConfigError, match="batches 'newest' is not one of"):
        CadencePolicy(batches="newest")  # type: ignore[arg-type]


def test_draining_worker_receives_nothing() -> None:
    draining = make_worker("d", residents=[900], draining=True)
    snap = make_snapshot([draining], pending=[make_pending("t", 10)])
    actions, _ = plan(snap)
    assert placed_on(actions) == {}
    assert evictions(actions) == []


def _fresh_batch(n: int) -> list[FreshSample]:
    return [make_fresh(f"f{i:02d}", prompt=100) for i in range(n)]


def test_placement_respects_the_engines_sequence_limit() -> None:
    tight = make_worker("tight", capacity=5_000, max_seqs=3)
    roomy = make_worker("roomy", capacity=50_000, max_seqs=3)
    snap = make_snapshot([tight, roomy], fresh=_fresh_batch(8), admitted=1, total_groups=1)
    placed = placed_on(plan(snap)[0])
    assert sorted(placed.values()).count("tight") == 3  # the tightest fills to its limit
    assert sorted(placed.values()).count("roomy") == 3
    assert len(placed) == 6  # the other two wait rather than queue inside an engine


def test_tight_fit_fills_each_worker_until_its_step_doubles_then_spreads() -> None:
    # 10 ms of weights a step, 1 ms of compute a sequence: past 20 residents a step
    # takes over twice an empty one's 10 ms.
    weak = make_cost(weights_ms=10.0, seq_ms=1.0)
    workers = [make_worker(f"w{i}", capacity=100_000 + i, cost=weak) for i in range(3)]
    snap = make_snapshot(workers, fresh=_fresh_batch(50), admitted=1, total_groups=1)
    assert Counter(placed_on(plan(snap)[0]).values()) == {"w0": 20, "w1": 20, "w2": 10}
    snap = make_snapshot(workers, fresh=_fresh_batch(75), admitted=1, total_groups=1)
    per = Counter(placed_on(plan(snap)[0]).values())
    assert per == {"w0": 25, "w1": 25, "w2": 25}  # all past doubling: fewest first, even


def test_kv_reads_that_outgrow_the_weights_spread_work_too() -> None:
    # Memory-bound throughout: 10 ms of weights, 1 us a token of KV; 1,000-token
    # trajectories double the step at 10 residents. Tight fit fills w0 to 10, then w1;
    # the last four go one by one to whichever holds fewer.
    bandwidth_bound = make_cost(weights_ms=10.0, kv_token_us=1.0)
    workers = [make_worker(f"w{i}", capacity=1_000_000 + i, cost=bandwidth_bound) for i in range(2)]
    fresh = [make_fresh(f"f{i:02d}", prompt=1_000) for i in range(24)]
    snap = make_snapshot(workers, fresh=fresh, admitted=1, total_groups=1)
    assert Counter(placed_on(plan(snap)[0]).values()) == {"w0": 12, "w1": 12}


def test_where_kv_binds_first_tight_fit_is_unchanged() -> None:
    # The same pool with a step cost whose knee is far beyond what KV holds.
    strong = make_cost(weights_ms=10.0, seq_ms=0.001)
    workers = [make_worker(f"w{i}", capacity=2_000 + i, cost=strong) for i in range(3)]
    snap = make_snapshot(workers, fresh=_fresh_batch(25), admitted=1, total_groups=1)
    per = Counter(placed_on(plan(snap)[0]).values())
    assert per == {"w0": 20, "w1": 5}  # the tightest fills first, the roomiest stays free


def test_workers_with_room_to_spare_for_the_longest_trajectory_share_work() -> None:
    # 10 ms a step whatever the batch, and room for 90 trajectories of the longest
    # context (1,000 tokens) each: a gap kept on either is one no trajectory can need.
    flat = make_cost(weights_ms=10.0, seq_ms=0.001)
    workers = [make_worker(f"w{i}", capacity=100_000 + i, cost=flat) for i in range(2)]
    fresh = _fresh_batch(20)
    known = make_knobs(max_model_len=1_000)
    snap = make_snapshot(workers, fresh=fresh, knobs=known, admitted=1, total_groups=1)
    assert Counter(placed_on(plan(snap)[0]).values()) == {"w0": 10, "w1": 10}
    # The paper's tight fit on every worker (the `packed` ablation), or the longest
    # context unknown: the tighter fills.
    snap = make_snapshot(workers, fresh=fresh, knobs=known, admitted=1, total_groups=1)
    packed, _ = CadencePolicy(fit="packed").plan(snap, CadenceState())
    assert Counter(placed_on(packed).values()) == {"w0": 20}
    snap = make_snapshot(workers, fresh=fresh, admitted=1, total_groups=1)
    assert Counter(placed_on(plan(snap)[0]).values()) == {"w0": 20}


def test_a_worker_short_of_room_for_the_longest_trajectory_is_filled_first() -> None:
    # "short" can take short work, but then not a trajectory of max_model_len as well:
    # its gap is the one tight fit fills (ten of 100 tokens), keeping the roomy worker
    # for what needs it.
    flat = make_cost(weights_ms=10.0, seq_ms=0.001)
    short = make_worker("short", capacity=1_050, cost=flat)
    roomy = make_worker("roomy", capacity=100_000, cost=flat)
    knobs = make_knobs(max_model_len=1_000)
    snap = make_snapshot(
        [short, roomy], fresh=_fresh_batch(12), knobs=knobs, admitted=1, total_groups=1
    )
    assert Counter(placed_on(plan(snap)[0]).values()) == {"short": 10, "roomy": 2}


def test_with_room_to_spare_work_goes_to_the_faster_step() -> None:
    # Two roomy workers, each resident of 1,000 tokens adding 1 ms to a step: the fast
    # one (50 ms a step) takes work until its step would pass the slow one's (100 ms),
    # though the slow one is the tighter fit.
    fast = make_worker("fast", capacity=200_000, cost=make_cost(weights_ms=50, kv_token_us=1))
    slow = make_worker("slow", capacity=150_000, cost=make_cost(weights_ms=100, kv_token_us=1))
    fresh = [make_fresh(f"f{i:02d}", prompt=1_000) for i in range(30)]
    knobs = make_knobs(max_model_len=2_000)
    snap = make_snapshot([fast, slow], fresh=fresh, knobs=knobs, admitted=1, total_groups=1)
    assert Counter(placed_on(plan(snap)[0]).values()) == {"fast": 30}
    snap = make_snapshot([fast, slow], fresh=fresh, admitted=1, total_groups=1)
    assert Counter(placed_on(plan(snap)[0]).values()) == {"slow": 30}


def test_a_departed_trajectory_with_no_room_holds_the_roomiest_worker_from_new_work() -> None:
    # "long" fits nowhere now; fresh work could take both workers' gaps, but the roomier
    # one is held for it, so its gap only grows as its residents finish.
    busy = make_worker("busy", capacity=1_000, residents=[600])
    roomy = make_worker("roomy", capacity=1_000, residents=[300])
    snap = make_snapshot(
        [busy, roomy],
        pending=[make_pending("long", 800)],
        fresh=_fresh_batch(3),
        admitted=1,
        total_groups=1,
    )
    placed = placed_on(plan(snap)[0])
    assert "long" not in placed
    assert set(placed.values()) == {"busy"}
    # Once it is placed, nothing is held.
    roomy_later = make_worker("roomy", capacity=1_000, residents=[100])
    snap = make_snapshot(
        [busy, roomy_later],
        pending=[make_pending("long", 800)],
        fresh=_fresh_batch(3),
        admitted=1,
        total_groups=1,
    )
    placed = placed_on(plan(snap)[0])
    assert placed["long"] == "roomy"


def test_a_longest_context_below_one_token_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_model_len is 0; it must be >= 1"):
        make_knobs(max_model_len=0)
