"""Each sample's response length under a run's length law (`batch.responseLengths`),
drawn exactly as the simulator draws it: one generator seeded by the law's seed, groups in
admission order, each group's lengths capped at `maxTokens`. So `cadence run` and
`cadence sim` on one file decode the same lengths sample for sample, and the control loop
gives each fresh sample its length as its token budget, decoded whatever the model
samples (`Sampling.ignore_eos`). A sample re-queued from its prompt keeps its length: the
budget is a function of the sample, not of the attempt.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from cadence.sim.workload import LengthLaw, MultiTurn, Sample, generate_group


class Budgets:
    """The response length of sample `index` of group `group`, for every group."""

    def __init__(self, law: LengthLaw, group_size: int, max_tokens: int, seed: int) -> None:
        self._groups = self._draw(law, group_size, max_tokens, random.Random(seed))
        self._drawn: list[list[Sample]] = []

    @staticmethod
    def _draw(
        law: LengthLaw, group_size: int, max_tokens: int, rng: random.Random
    ) -> Iterator[list[Sample]]:
        group = 0
        while True:
            # The simulator's room is max_model_len less the prompt: maxTokens here.
            yield generate_group(
                rng,
                group,
                group_size,
                prompt_tokens=0,
                lengths=law,
                max_model_len=max_tokens,
                multi_turn=MultiTurn(),
            )
            group += 1

    def of(self, group: int, index: int) -> int:
        while len(self._drawn) <= group:
            self._drawn.append(next(self._groups))
        return self._drawn[group][index].response_tokens
