"""One GRPO update: advantages per group with failed samples masked, logprobs recomputed
as the worker sampled them, and a step that makes rewarded completions likelier."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from cadence.trainer.grpo import Scored, UpdateConfig, advantages, token_logprobs, update
from cadence.worker.api import FreshStart, PlaceRequest, Sampling, TrajectoryState
from cadence.worker.engine import EngineRequest
from cadence.worker.torchsource import TorchTokenSource

from ..worker.factories import Pool, moved
from .factories import delivery

PROMPT = [5, 17, 99, 3, 250, 8, 41, 7]


def _model(path: Path) -> Any:
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


def test_group_advantages_are_normalised_per_group_and_failed_samples_masked() -> None:
    batch = [
        Scored(0, delivery("a"), 1.0),
        Scored(0, delivery("b"), 0.0),
        Scored(0, delivery("c", failed=True), 0.0),
        Scored(1, delivery("d"), 0.5),
        Scored(1, delivery("e"), 0.5),
    ]
    adv = advantages(batch, "group")
    assert adv[0] == pytest.approx(0.7071, abs=1e-3) and adv[1] == pytest.approx(-0.7071, abs=1e-3)
    assert adv[2] == 0.0  # masked
    assert adv[3] == adv[4] == 0.0  # no variance, no signal
    assert advantages(batch, "batch")[3] == pytest.approx(0.0)


def _sampled(path: Path, temperature: float, n: int = 12) -> tuple[list[int], list[float]]:
    """Tokens and logprobs exactly as the emulated worker's source produces them."""
    source = TorchTokenSource(path)
    request = EngineRequest("r", PROMPT, n, Sampling(temperature=temperature, seed=7))
    for _ in range(n):
        s = source.next_tokens([request])[0]
        request.output.token_ids.append(s.token)
        request.output.logprobs.append(s.logprob)
    return request.output.token_ids, request.output.logprobs


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_recomputed_logprobs_match_the_workers(tiny_model: Path, temperature: float) -> None:
    tokens, logprobs = _sampled(tiny_model, temperature)
    with torch.inference_mode():
        mine = token_logprobs(_model(tiny_model), PROMPT + tokens, temperature)[len(PROMPT) - 1 :]
    assert torch.allclose(mine, torch.tensor(logprobs), atol=1e-4)


@pytest.mark.parametrize("lr", [1e-2, 0.0])
def test_an_update_makes_the_rewarded_completion_likelier(tiny_model: Path, lr: float) -> None:
    model = _model(tiny_model)
    good, good_lp = _sampled(tiny_model, 1.0, 8)
    bad = [(t + 1) % 1000 for t in good]
    with torch.inference_mode():
        bad_lp = token_logprobs(model, PROMPT + bad, 1.0)[len(PROMPT) - 1 :].tolist()
    batch = [
        Scored(0, delivery("g", prompt=PROMPT, tokens=good, logprobs=good_lp), 1.0),
        Scored(0, delivery("b", prompt=PROMPT, tokens=bad, logprobs=bad_lp), 0.0),
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    stats = update(model, optimizer, batch, UpdateConfig())
    assert stats.max_abs_logprob_diff < 1e-4 and stats.tokens == 16
    with torch.inference_mode():
        after = token_logprobs(model, PROMPT + good, 1.0)[len(PROMPT) - 1 :].sum().item()
    before = sum(good_lp)
    if lr > 0:
        assert after > before + 0.1
    else:
        assert after == pytest.approx(before, abs=1e-4)


def test_logprobs_of_a_trajectory_that_migrated_match_the_workers(tiny_model: Path) -> None:
    """Decoded on one emulated worker, evicted, finished on another: the trainer's
    recomputed logprobs match what both workers reported."""
    pool = Pool()
    a = pool.add("a", source=TorchTokenSource(tiny_model))
    b = pool.add("b", source=TorchTokenSource(tiny_model))
    sampling = Sampling(temperature=0.8, seed=11)
    start = FreshStart(prompt_token_ids=PROMPT, max_tokens=16, sampling=sampling)

    async def run() -> TrajectoryState:
        await a.place(PlaceRequest(id="t", attempt=0, version=0, fresh=start))
        for _ in range(7):
            await a.step()
        a.evict("t")
        await b.place(moved("t", pool.source("a"), attempt=1))
        while b.resident:
            await b.step()
        return b.finished[0]

    state = asyncio.run(run())
    assert [t.role for t in state.turns] == ["model", "model"]  # two stints
    tokens = [t for turn in state.turns for t in turn.token_ids]
    given = [lp for turn in state.turns for lp in turn.logprobs or []]
    with torch.inference_mode():
        mine = token_logprobs(_model(tiny_model), PROMPT + tokens, 0.8)[len(PROMPT) - 1 :]
    assert torch.allclose(mine, torch.tensor(given), atol=1e-4)
