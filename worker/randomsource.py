"""Seeded random token ids for the emulated engine, without a model.

It exists for control-plane benches (`cadence bench loop`) where what the tokens say
does not matter, only that every resident gains one per step: a tiny Llama per worker
costs a forward pass per step, which a thousand emulated workers on a few cores cannot
afford. Never use it where tokens are trained on or read: they are noise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path

from cadence.worker.emulated import Sampled
from cadence.worker.engine import EngineRequest


class RandomTokenSource:
    """Each next token is drawn uniformly from `[0, vocab_size)` less `avoid` (say the end
    of sequence, so a sample runs to its budget) by one generator seeded with `seed`, with
    the logprob of that uniform draw. Reproducible for one sequence of calls; not per
    request, so a moved trajectory does not continue as it would have in place."""

    def __init__(self, vocab_size: int, seed: int = 0, avoid: Sequence[int] = ()) -> None:
        if vocab_size <= len(set(avoid)):
            raise ValueError(f"a vocabulary of {vocab_size} leaves no token to draw")
        self._vocab_size = vocab_size
        self._avoid = frozenset(avoid)
        self._rng = random.Random(seed)
        self._logprob = -math.log(vocab_size - len(self._avoid))

    @property
    def vocab_size(self) -> int | None:
        return self._vocab_size

    def next_tokens(self, batch: Sequence[EngineRequest]) -> list[Sampled]:
        out = []
        for _ in batch:
            token = self._rng.randrange(self._vocab_size)
            while token in self._avoid:
                token = self._rng.randrange(self._vocab_size)
            out.append(Sampled(token, self._logprob))
        return out

    def forget(self, rid: str) -> None:
        pass  # nothing is kept per request

    def load_weights(self, path: Path) -> None:
        pass  # no model: a new version's weights change nothing here
