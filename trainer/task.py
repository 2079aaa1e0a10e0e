"""Tasks: where prompts and their answers come from, and which verifier scores them.

`digits` is the toy task the learning test and `cadence bench learn` use. The prompt
asks for a run of sevens; the reward is the share of the first 16 characters the model
writes (spaces left out) that are "7". It is verifiable, graded (most groups have some
variance for GRPO to use) and learnable by a tiny random-weight model in about ten
versions: a random model writes a seven about one character in twenty, and the policy
only has to move its mass onto the vocabulary's sevens ("7", "77", " 77", ...). A
learning rate of 0 leaves it where it started, which is the control
(docs/benchmarks.md, "Learning").

`arithmetic` pairs calculator-style questions with their answers for the `math`
verifier (and the calculator environment on multi-turn runs).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from cadence.trainer.rewards import VERIFIERS, Verifier


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    answer: str


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    verifier: str  # a key of VERIFIERS

    def prompts(self, seed: int = 0) -> Iterator[Prompt]:
        """An endless, reproducible stream of prompts."""
        rng = random.Random(seed)
        while True:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            if self.name == "digits":
                yield Prompt(f"After {a} and {b}, write 7 again and again:", "7")
            else:
                yield Prompt(f"What is {a} + {b}? Use <tool>calc ...</tool>.", str(a + b))

    @property
    def score(self) -> Verifier:
        return VERIFIERS[self.verifier]


TASKS = {"digits": Task("digits", "digits"), "arithmetic": Task("arithmetic", "math")}
