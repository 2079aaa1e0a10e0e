"""The emulated engine on a real (tiny, random-weight) causal LM: moves are invisible in
what it generates, and its logprobs are those of what it sampled."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from cadence.worker.api import Sampling
from cadence.worker.emulated import EmulatedEngine
from cadence.worker.engine import EngineRequest
from cadence.worker.torchsource import TorchTokenSource

from .factories import FakeClock, deployment


def _generate(path: Path, sampling: Sampling, stops: list[int], total: int = 24) -> list[int]:
    """Decode up to `total` tokens of one prompt, moving the request to a fresh engine (its
    own model instance, as another worker would have) whenever its count reaches a stop."""
    prompt = [5, 17, 99, 3, 250, 8]
    generated: list[int] = []
    for cut in [*stops, total]:
        engine = EmulatedEngine(deployment(), TorchTokenSource(path), clock=FakeClock())
        request = EngineRequest("t", prompt + generated, total - len(generated), sampling)
        engine.add(request)

        async def run(engine: EmulatedEngine = engine, steps: int = cut - len(generated)) -> None:
            for _ in range(steps):
                if not engine.requests:
                    break
                await engine.step()

        asyncio.run(run())
        if engine.requests:
            engine.abort("t")
        generated += request.output.token_ids
        if request.done:
            break
    return generated


@pytest.mark.parametrize(
    "sampling", [Sampling(temperature=0.0), Sampling(temperature=1.0, top_p=0.9, seed=7)]
)
def test_moves_do_not_change_what_is_generated(tiny_model: Path, sampling: Sampling) -> None:
    whole = _generate(tiny_model, sampling, stops=[])
    assert 0 < len(whole) <= 24
    assert _generate(tiny_model, sampling, stops=[5]) == whole
    assert _generate(tiny_model, sampling, stops=[3, 9, 15]) == whole


def test_logprobs_are_those_a_full_forward_pass_gives(tiny_model: Path) -> None:
    source = TorchTokenSource(tiny_model)
    engine = EmulatedEngine(deployment(), source, clock=FakeClock())
    prompt = [5, 17, 99, 3]
    engine.add(EngineRequest("t", prompt, 6, Sampling(temperature=0.0)))

    async def run() -> list[EngineRequest]:
        done: list[EngineRequest] = []
        while engine.requests:
            done += await engine.step()
        return done

    (request,) = asyncio.run(run())
    ids = prompt + request.output.token_ids
    with torch.inference_mode():
        logits = source.model(torch.tensor([ids])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)
    for i, (token, logprob) in enumerate(
        zip(request.output.token_ids, request.output.logprobs, strict=True)
    ):
        assert logprob == pytest.approx(float(expected[len(prompt) - 1 + i, token]), abs=1e-4)


def test_a_batch_decodes_what_each_request_would_decode_alone(tiny_model: Path) -> None:
    """Residents of different lengths decoded together (one padded forward pass) sample
    exactly the tokens each samples alone, so batching changes no trajectory."""
    together, alone = TorchTokenSource(tiny_model), TorchTokenSource(tiny_model)
    prompts = [[5, 17, 99], [3, 250, 8, 40, 41, 42, 43], [7] * 20, [9, 9]]
    batch = [EngineRequest(f"r{i}", p, 30, Sampling(seed=i)) for i, p in enumerate(prompts)]
    single = [EngineRequest(f"r{i}", p, 30, Sampling(seed=i)) for i, p in enumerate(prompts)]
    for _ in range(30):
        for r, s in zip(batch, together.next_tokens(batch), strict=True):
            r.output.token_ids.append(s.token)
        for r in single:
            r.output.token_ids.append(alone.next_tokens([r])[0].token)
    assert [r.output.token_ids for r in batch] == [r.output.token_ids for r in single]


def test_a_resident_evicted_mid_step_neither_breaks_the_step_nor_keeps_its_cache(
    tiny_model: Path,
) -> None:
    """The engine steps in a thread while the worker's event loop evicts: a cache
    forgotten while a step runs (here, during another request's prefill, before the
    batched decode reads it) is dropped once the step ends."""
    source = TorchTokenSource(tiny_model)
    a = EngineRequest("a", [5, 17, 99], 30, Sampling(seed=1))
    b = EngineRequest("b", [3, 250, 8], 30, Sampling(seed=2))
    a.output.token_ids.append(source.next_tokens([a])[0].token)  # a's cache is current
    model = source.model

    def forward_that_evicts(*args: object, **kwargs: object) -> object:
        source.forget("a")
        return model(*args, **kwargs)

    source.model = forward_that_evicts
    sampled = source.next_tokens([a, b])  # b prefills (a forgotten), then a decodes
    source.model = model
    assert len(sampled) == 2
    assert set(source._cache) == {"b"}
