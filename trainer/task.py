"""Tasks: where prompts and their answers come from, and which verifier scores them.

`digits` is the toy task the learning test and `cadence bench learn` use. The prompt
asks for a long number; the reward is the share of digits among the first
`DIGITS_CHARS` characters the model writes. It is verifiable, dense (every sample gets
a graded reward, so a group rarely has zero variance) and learnable by a tiny
random-weight model in a few versions, because it only asks the policy to move mass
onto the vocabulary's digit tokens: a random model writes few digits (the tokenizer's
vocabulary is mostly letters), a trained one writes mostly digits. A learning rate of 0
leaves it where it started, which is the control.

`arithmetic` pairs calculator-style questions with their answers for the `math`
verifier (and the calculator environment on multi-turn runs).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from cadence.trainer.rewards import VERIFIERS, Verifier

DIGITS_CHARS = 16


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
                yield Prompt(f"Write a long number after {a} and {b}:", str(DIGITS_CHARS))
            else:
                yield Prompt(f"What is {a} + {b}? Use <tool>calc ...</tool>.", str(a + b))

    @property
    def score(self) -> Verifier:
        return VERIFIERS[self.verifier]


TASKS = {"digits": Task("digits", "digits"), "arithmetic": Task("arithmetic", "math")}
