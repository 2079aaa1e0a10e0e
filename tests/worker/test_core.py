"""A worker's trajectories: placement, departure, the two-phase hand-off and fencing."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from cadence.worker.api import ClaimRequest, Fence, PlaceRequest, ReleaseRequest
from cadence.worker.core import WorkerCore
from cadence.worker.engine import EngineRequest
from cadence.worker.held import Refused

from .factories import Pool, fresh, moved


def _steps(core: WorkerCore, n: int) -> None:
    async def go() -> None:
        for _ in range(n):
            await core.step()

    asyncio.run(go())


def _finish(core: WorkerCore) -> list[int]:
    async def go() -> list[int]:
        while core.resident:
            await core.step()
        state = core.finished.pop()
        return [t for turn in state.turns for t in turn.token_ids]

    return asyncio.run(go())


def _uninterrupted(max_tokens: int) -> list[int]:
    pool = Pool()
    a = pool.add("ref")
    asyncio.run(a.place(fresh("t", max_tokens=max_tokens)))
    return _finish(a)


def test_a_trajectory_moved_three_times_yields_the_uninterrupted_tokens() -> None:
    pool = Pool()
    workers = [pool.add(w) for w in ("a", "b", "c", "d")]
    asyncio.run(workers[0].place(fresh("t", max_tokens=40)))
    for hop, (src, dst) in enumerate(itertools.pairwise(workers), start=1):
        _steps(src, 7)
        evicted = src.evict("t")
        assert evicted.context == 16 + 7 * hop
        assert pool.where_resident("t") == []
        asyncio.run(dst.place(moved("t", pool.source(src.identity.worker_id), attempt=hop)))
        assert pool.where_resident("t") == [dst.identity.worker_id]
        assert "t" not in src.parked  # released after the destination acknowledged
    tokens = _finish(workers[-1])
    assert tokens == _uninterrupted(40)
    state = workers[-1].state()
    assert state.residents == [] and state.kv_used_tokens == 0


def test_state_reports_residents_and_parked_with_their_lengths() -> None:
    pool = Pool()
    a = pool.add("a", capacity=1_000)
    asyncio.run(a.place(fresh("x", prompt=100)))
    asyncio.run(a.place(fresh("y", prompt=50)))
    _steps(a, 3)
    a.evict("y")
    state = a.state()
    assert [(r.id, r.context, r.decoded_since_placement) for r in state.residents] == [
        ("x", 103, 3)
    ]
    assert [(p.id, p.context, p.reason) for p in state.parked] == [("y", 53, "evicted")]
    assert state.kv_used_tokens == 103 and state.headroom_tokens == 897
    assert state.engine == "emulated"


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (fresh("t", version=1), "version"),
        (fresh("t", prompt=2_000), "no_room"),
    ],
)
def test_refused_placements_say_why_and_change_nothing(request_: PlaceRequest, reason: str) -> None:
    pool = Pool()
    a = pool.add("a", capacity=1_000)
    with pytest.raises(Refused) as e:
        asyncio.run(a.place(request_))
    assert (e.value.status, e.value.reason) == (409, reason)
    assert a.resident == {} and a.engine.used_tokens() == 0


def test_a_retried_placement_is_idempotent_and_an_older_attempt_is_refused() -> None:
    pool = Pool()
    a = pool.add("a")
    first = asyncio.run(a.place(fresh("t", attempt=3)))
    assert asyncio.run(a.place(fresh("t", attempt=3))) == first
    assert len(a.engine.requests) == 1
    a.evict("t")
    with pytest.raises(Refused, match="not newer") as e:
        asyncio.run(a.place(fresh("t", attempt=2)))
    assert e.value.reason == "stale_attempt"


def test_a_destination_that_cannot_start_leaves_the_state_parked_on_the_source() -> None:
    pool = Pool()
    a, small = pool.add("a"), pool.add("small", capacity=20)
    asyncio.run(a.place(fresh("t")))
    _steps(a, 10)
    a.evict("t")
    with pytest.raises(Refused, match="do not fit"):
        asyncio.run(small.place(moved("t", pool.source("a"), attempt=1)))
    assert "t" in a.parked and pool.where_resident("t") == []
    b = pool.add("b")
    asyncio.run(b.place(moved("t", pool.source("a"), attempt=2)))  # a later placement
    assert pool.where_resident("t") == ["b"] and "t" not in a.parked


def test_an_unacknowledged_hand_off_keeps_the_claim_and_never_runs_twice() -> None:
    pool = Pool()
    a, b, c = pool.add("a"), pool.add("b"), pool.add("c")
    asyncio.run(a.place(fresh("t")))
    _steps(a, 5)
    a.evict("t")
    real_release = b.release_at

    async def lost_ack(*args: object) -> None:
        raise ConnectionError("the acknowledgement was lost")

    b.release_at = lost_ack
    asyncio.run(b.place(moved("t", pool.source("a"), attempt=1)))
    assert pool.where_resident("t") == ["b"]
    assert a.parked["t"].lease is not None and a.parked["t"].lease[:2] == ("b", 1)
    # b is declared lost; the control loop places attempt 2 on c, which supersedes b's
    # claim. b's late acknowledgement is refused, and b stops its stale copy.
    asyncio.run(c.place(moved("t", pool.source("a"), attempt=2)))
    b.release_at = real_release
    asyncio.run(b.retry_releases())
    assert pool.where_resident("t") == ["c"]
    assert b.unreleased == {}
    with pytest.raises(Refused, match="not claimed"):
        a.release("t", ReleaseRequest(attempt=1, destination="b"))
    a.release("t", ReleaseRequest(attempt=2, destination="c"))  # c's, repeated: answered


def test_drain_departs_every_resident_and_refuses_new_work() -> None:
    pool = Pool()
    a = pool.add("a")
    for rid in ("x", "y"):
        asyncio.run(a.place(fresh(rid)))
    _steps(a, 2)
    departed = a.drain()
    assert sorted(d.id for d in departed) == ["x", "y"]
    assert a.resident == {} and set(a.parked) == {"x", "y"}
    with pytest.raises(Refused) as e:
        asyncio.run(a.place(fresh("z")))
    assert e.value.reason == "draining"


def test_throughput_is_tokens_per_modelled_second_and_falls_to_zero_when_idle() -> None:
    pool = Pool()
    a = pool.add("a")
    for i in range(4):
        asyncio.run(a.place(fresh(f"t{i}", max_tokens=1000)))
    _steps(a, 2)  # the prefill, then steady decoding
    start, decoded = pool.clock.now(), a.engine.decoded_tokens
    _steps(a, 20)
    expected = (a.engine.decoded_tokens - decoded) / (pool.clock.now() - start)
    assert a.throughput() == pytest.approx(expected, rel=0.1)
    pool.clock.work(60.0)
    assert a.throughput() == 0.0


def test_time_parked_counts_as_pending_across_a_hand_off() -> None:
    pool = Pool()
    a, b = pool.add("a"), pool.add("b")
    asyncio.run(a.place(fresh("t")))
    _steps(a, 3)
    a.evict("t")
    pool.clock.work(5.0)
    asyncio.run(b.place(moved("t", pool.source("a"), attempt=1)))
    _steps(b, 2)
    b.evict("t")
    pool.clock.work(2.0)
    asyncio.run(b.place(moved("t", pool.source("b"), attempt=2)))
    assert b.resident["t"].timings.pending_s == pytest.approx(7.0)


def test_an_eviction_that_finds_the_last_token_decoded_ends_the_trajectory_there() -> None:
    # The engine decoded the last token between the loop's observation and the eviction:
    # nothing is left to resume anywhere, so it is delivered, not parked for ever.
    pool = Pool()
    a = pool.add("a")
    asyncio.run(a.place(fresh("t", max_tokens=5)))
    _steps(a, 4)
    out = a.engine.requests["t"].output
    out.token_ids.append(7)
    out.logprobs.append(-0.5)
    with pytest.raises(Refused) as refused:
        a.evict("t")
    assert refused.value.status == 409 and "finished" in str(refused.value)
    assert "t" not in a.parked and "t" not in a.resident
    delivered = a.finished.pop()
    assert sum(len(turn.token_ids) for turn in delivered.turns) == 5


def test_an_eviction_of_a_trajectory_the_engine_ended_since_the_last_step_is_refused() -> None:
    """vLLM ends a request as its last token streams in, between the worker's steps:
    an eviction then finds it gone from the engine (a worker answered 500 with a
    KeyError). It is refused as finished, and the next step delivers it once."""
    pool = Pool()
    a = pool.add("a")
    asyncio.run(a.place(fresh("t", max_tokens=5)))
    _steps(a, 4)
    engine = a.engine
    ended = engine.requests.pop("t")  # as vLLM's stream does when the request ends
    ended.output.token_ids.append(7)
    ended.output.logprobs.append(-0.5)
    step = engine.step

    async def step_handing_it_over() -> list[EngineRequest]:
        return [ended, *await step()]

    engine.step = step_handing_it_over  # type: ignore[method-assign]
    with pytest.raises(Refused) as refused:
        a.evict("t")
    assert refused.value.status == 409 and refused.value.reason == "finished"
    assert "t" in a.resident and "t" not in a.parked
    _steps(a, 1)
    assert "t" not in a.resident and len(a.finished) == 1


def test_a_fence_drops_copies_under_older_attempts_and_keeps_current_and_claimed_ones() -> None:
    pool = Pool()
    a = pool.add("a")
    for rid in ("old", "current", "parked"):
        asyncio.run(a.place(fresh(rid, max_tokens=40)))
    _steps(a, 2)
    a.evict("parked")
    a.evict("current")
    asyncio.run(a.claim("current", ClaimRequest(attempt=3, destination="b")))

    fences = [
        Fence(id="old", attempt=1),
        Fence(id="current", attempt=3),  # leased to attempt 3: kept until released
        Fence(id="parked", attempt=2),
    ]
    dropped = a.fence(fences)

    assert sorted(dropped) == ["old", "parked"]
    assert "old" not in a.resident and "parked" not in a.parked and "current" in a.parked
    assert a.counts["fenced"] == 2
    assert a.engine.requests.get("old") is None, "its KV is freed"
    with pytest.raises(Refused) as refused:
        asyncio.run(a.place(fresh("old", max_tokens=40)))  # a replay of attempt 0
    assert refused.value.reason == "stale_attempt"


def test_latency_is_summed_on_each_workers_own_clock_and_ignores_wall_clock_jumps() -> None:
    """A trajectory decoded on a, parked, then moved to b whose wall clock is an hour
    ahead: its elapsed time is what passed, not what the two wall clocks differ by."""
    pool = Pool()
    a, b = pool.add("a"), pool.add("b")
    b.wall = lambda: 3_600.0 + pool.clock.now()  # b's wall clock jumped an hour
    started = pool.clock.now()
    asyncio.run(a.place(fresh("t", max_tokens=40)))
    _steps(a, 5)
    a.evict("t")
    pool.clock.work(2.0)  # parked on a
    asyncio.run(b.place(moved("t", pool.source("a"), attempt=1)))

    async def finish() -> None:
        while b.resident:
            await b.step()

    asyncio.run(finish())
    timings = b.finished.pop().timings
    assert timings.elapsed_s == pytest.approx(pool.clock.now() - started)
    assert timings.pending_s == pytest.approx(2.0)
    assert timings.elapsed_s < 60


def test_a_lease_whose_destination_gave_up_stops_being_reported_when_it_ends() -> None:
    """A claim that landed after its placement timed out leaves a lease no one will
    release; reported for ever, the loop never planned the trajectory again (a vLLM run
    sat with three such samples parked and every worker idle)."""
    pool = Pool()
    a = pool.add("a")
    asyncio.run(a.place(fresh("t", max_tokens=40)))
    a.evict("t")
    asyncio.run(a.claim("t", ClaimRequest(attempt=1, destination="b", lease_s=5.0)))
    assert a.state().parked[0].claimed_until is not None
    pool.clock.work(5.5)
    assert a.state().parked[0].claimed_until is None
    b = pool.add("b")
    asyncio.run(b.place(moved("t", pool.source("a"), attempt=2)))  # supersedes the lease
    assert pool.where_resident("t") == ["b"] and "t" not in a.parked
