"""The emulated engine keeps its accelerator's pace, and says when the host cannot."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from cadence.common.physics import Deployment
from cadence.worker.emulated import EmulatedEngine, Pacer, Sampled
from cadence.worker.engine import EngineRequest, RoomError

from .factories import FakeClock, deployment


def _deployment(accelerator: str) -> Deployment:
    return deployment(accelerator)


def _run_steps(pacer: Pacer, clock: FakeClock, steps: int, host_s: float) -> list[float]:
    """Play `steps` decode steps of 64 residents with 64K tokens of KV; each step the
    host spends `host_s` producing tokens. Returns the wall time each step took."""

    async def play() -> list[float]:
        took = []
        for _ in range(steps):
            start = clock.now()
            pacer.begin(pacer.step_s(64, 65_536))
            clock.work(host_s)
            await pacer.finish()
            took.append(clock.now() - start)
        return took

    return asyncio.run(play())


def test_step_durations_stand_in_the_rooflines_ratio() -> None:
    a910x, h800 = _deployment("A910X"), _deployment("H800")
    durations = {}
    for name, d in (("A910X", a910x), ("H800", h800)):
        clock = FakeClock()
        pacer = Pacer(d, clock, compression=10.0)
        durations[name] = _run_steps(pacer, clock, 20, host_s=0.0001)
        assert not pacer.fell_behind
    expected = a910x.decode_step_s(64, 65_536) / h800.decode_step_s(64, 65_536)
    assert expected != pytest.approx(1.0, abs=0.05)  # the two really differ
    for a, h in zip(durations["A910X"], durations["H800"], strict=True):
        assert a / h == pytest.approx(expected, rel=1e-9)
    assert durations["H800"][0] == pytest.approx(h800.decode_step_s(64, 65_536) / 10.0)


def test_a_host_too_slow_for_the_pace_is_reported_not_hidden() -> None:
    clock = FakeClock()
    pacer = Pacer(_deployment("H800"), clock)
    step = pacer.step_s(64, 65_536)
    assert 2 * step > pacer.slack_s
    took = _run_steps(pacer, clock, 10, host_s=step * 3)
    assert pacer.fell_behind
    assert pacer.late_steps == 10
    assert pacer.lag_s == pytest.approx(10 * 2 * step, rel=1e-6)
    assert all(t == pytest.approx(step * 3) for t in took)  # no catching up by skipping


def test_compression_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Pacer(_deployment("H800"), FakeClock(), compression=0.0)


class CountingSource:
    """A token source for engine tests: the next token is the context length, mod 1000."""

    vocab_size: int | None = None  # the tests' token ids are their own

    def next_tokens(self, batch: Sequence[EngineRequest]) -> list[Sampled]:
        return [Sampled(len(r.token_ids) % 1000, -0.5) for r in batch]

    def forget(self, rid: str) -> None:
        pass

    def load_weights(self, path: Path) -> None:
        raise NotImplementedError("a counting source has no weights")


def _engine(clock: FakeClock, capacity: int = 1_000) -> EmulatedEngine:
    d = _deployment("H800")
    small = Deployment(d.model, d.accelerator, d.tp, capacity, d.efficiency)
    return EmulatedEngine(small, CountingSource(), clock=clock)


def test_decode_steps_are_timed_with_their_batch_and_context() -> None:
    clock = FakeClock()
    engine = _engine(clock)
    engine.add(EngineRequest("a", [1] * 100, max_new_tokens=2))
    engine.add(EngineRequest("b", [2] * 50, max_new_tokens=3))
    asyncio.run(engine.step())  # the prefill, then a step of both at 150 tokens
    clock.work(0.5)  # the host was busy past the next step's modelled end
    asyncio.run(engine.step())  # both, at 152: it took the host's 0.5 s, not its model's
    asyncio.run(engine.step())  # b alone, at 52
    steps = engine.decode_steps
    assert steps is not None
    assert (steps.steps, steps.sequences, steps.context_tokens) == (3, 5, 150 + 152 + 52)
    assert engine.pacer.step_s(2, 152) < 0.5
    paced = engine.pacer.step_s(2, 150) + engine.pacer.step_s(1, 52)
    assert steps.seconds == pytest.approx(paced + 0.5)


def test_requests_decode_to_their_budget_and_account_their_kv() -> None:
    clock = FakeClock()
    engine = _engine(clock)
    engine.add(EngineRequest("a", [1] * 100, max_new_tokens=3))
    engine.add(EngineRequest("b", [2] * 50, max_new_tokens=5))
    assert engine.used_tokens() == 150

    async def until_done() -> dict[str, list[int]]:
        done = {}
        while engine.requests:
            for r in await engine.step():
                done[r.id] = r.output.token_ids
        return done

    done = asyncio.run(until_done())
    assert done == {"a": [100, 101, 102], "b": [50, 51, 52, 53, 54]}
    assert engine.decoded_tokens == 8
    assert engine.used_tokens() == 0


def test_residents_that_outgrow_the_cache_preempt_the_newest_until_room_returns() -> None:
    clock = FakeClock()
    engine = _engine(clock, capacity=100)
    engine.add(EngineRequest("old", [1] * 40, max_new_tokens=20))
    engine.add(EngineRequest("new", [2] * 40, max_new_tokens=30))

    async def run() -> list[tuple[str, bool, int]]:
        seen = []
        while engine.requests:
            for r in await engine.step():
                seen.append((r.id, r.preempted, len(r.output.token_ids)))
            assert engine.used_tokens() <= engine.capacity_tokens
            if engine.requests.get("new") is not None and engine.requests["new"].preempted:
                seen.append(("new", True, -1))
        return seen

    seen = asyncio.run(run())
    assert engine.preemptions == 1
    assert ("new", True, -1) in seen  # it waited while "old" ran to its end
    assert [s for s in seen if s[2] >= 0] == [("old", False, 20), ("new", False, 30)]


def test_a_request_that_does_not_fit_is_refused_and_nothing_changes() -> None:
    engine = _engine(FakeClock(), capacity=1_000)
    engine.add(EngineRequest("a", [1] * 900, max_new_tokens=10))
    with pytest.raises(RoomError, match="do not fit"):
        engine.add(EngineRequest("b", [1] * 200, max_new_tokens=10))
    assert list(engine.requests) == ["a"]


def test_abort_keeps_exactly_the_tokens_generated_so_far() -> None:
    engine = _engine(FakeClock())
    engine.add(EngineRequest("a", [1] * 10, max_new_tokens=100))
    for _ in range(4):
        asyncio.run(engine.step())
    stopped = engine.abort("a")
    assert stopped.output.token_ids == [10, 11, 12, 13]
    assert stopped.output.logprobs == [-0.5] * 4
    assert engine.used_tokens() == 0


def test_prefill_time_is_charged_before_the_first_decode_step() -> None:
    clock = FakeClock()
    engine = _engine(clock, capacity=100_000)
    engine.add(EngineRequest("a", [1] * 4_000, max_new_tokens=1))
    start = clock.now()
    asyncio.run(engine.step())
    expected = engine.pacer.prefill_s(4_000) + engine.pacer.step_s(1, 4_000)
    assert clock.now() - start == pytest.approx(expected)


class GatedSource(CountingSource):
    """A source whose step waits until the test lets it finish, so the test can act in
    the middle of a step, as an HTTP request can while tokens are computed."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def next_tokens(self, batch: Sequence[EngineRequest]) -> list[Sampled]:
        self.entered.set()
        self.release.wait(timeout=10)
        return super().next_tokens(batch)


def test_an_eviction_during_a_step_keeps_what_it_had_and_the_step_drops_its_token() -> None:
    clock = FakeClock()
    source = GatedSource()
    d = _deployment("H800")
    engine = EmulatedEngine(d, source, clock=clock)
    engine.add(EngineRequest("a", [1] * 10, max_new_tokens=100))
    engine.add(EngineRequest("b", [2] * 10, max_new_tokens=100))

    async def race() -> tuple[EngineRequest, list[EngineRequest]]:
        stepping = asyncio.create_task(engine.step())
        await asyncio.to_thread(source.entered.wait, 10)
        evicted = engine.abort("a")  # mid-step
        source.release.set()
        return evicted, await stepping

    evicted, finished = asyncio.run(race())
    assert evicted.output.token_ids == [] and finished == []
    assert list(engine.requests) == ["b"] and len(engine.requests["b"].output.token_ids) == 1
    assert engine.decoded_tokens == 1


def test_a_request_evicted_while_its_last_step_paces_is_the_evictors_not_finished() -> None:
    """The API may evict a request while a step waits out its time: the step must not
    also report it finished (nor fail on it, which stopped a worker's decoding)."""
    clock = FakeClock()
    engine = _engine(clock)
    engine.add(EngineRequest("a", [1] * 10, max_new_tokens=1))
    engine.add(EngineRequest("b", [2] * 10, max_new_tokens=1))
    finish = engine.pacer.finish
    calls = 0
    taken: list[EngineRequest] = []

    async def evicting_finish() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:  # the decode step's wait (the first is the prefill's)
            taken.append(engine.abort("a"))
        await finish()

    engine.pacer.finish = evicting_finish  # type: ignore[method-assign]
    finished = asyncio.run(engine.step())
    assert [r.id for r in finished] == ["b"]
    assert [r.id for r in taken] == ["a"] and taken[0].output.token_ids == [10]
    assert engine.requests == {}
