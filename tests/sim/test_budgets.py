"""A run's length law gives each sample the length the simulator draws for it."""

from __future__ import annotations

import random

import pytest

from cadence.operator.api.resources import ResponseLengths
from cadence.sim.budgets import Budgets
from cadence.sim.workload import MultiTurn, generate_group


def test_each_sample_gets_the_length_the_simulator_draws_for_it() -> None:
    law = ResponseLengths(law="lognormal", median_tokens=80, seed=7)
    budgets = Budgets(law.spec().build(), 8, 1024, 7)
    rng = random.Random(7)
    for group in range(20):
        drawn = generate_group(
            rng,
            group,
            8,
            prompt_tokens=28,
            lengths=law.spec().build(),
            max_model_len=28 + 1024,
            multi_turn=MultiTurn(),
        )
        assert [budgets.of(group, i) for i in range(8)] == [s.response_tokens for s in drawn]


def test_lengths_are_long_tailed_and_capped() -> None:
    law = ResponseLengths(law="lognormal", median_tokens=80, sigma_within_group=0.9)
    budgets = Budgets(law.spec().build(), 8, 1024, 0)
    lengths = sorted(budgets.of(g, i) for g in range(200) for i in range(8))
    assert lengths[-1] <= 1024
    assert lengths[int(0.99 * len(lengths))] > 5 * lengths[len(lengths) // 2]


def test_a_law_missing_what_it_needs_is_refused_in_one_sentence() -> None:
    with pytest.raises(ValueError, match="the mixture law needs components"):
        ResponseLengths(law="mixture")
    with pytest.raises(ValueError, match="takes no medianTokens"):
        ResponseLengths(law="empirical", lengths=[10, 20], median_tokens=5)
