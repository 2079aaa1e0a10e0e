"""The pool advisor: its successive-halving search finds what running every mix finds,
never spends past the budget, reports a consistent Pareto set, and refuses inputs no
mix can meet with a sentence."""

from __future__ import annotations

from itertools import product

import pytest

from cadence.sim.advise import (
    AdviceError,
    Offer,
    Outcome,
    Search,
    Targets,
    kinds_of,
    marginal,
    offers_of,
    pareto_ranks,
    scenario_of,
    search,
)
from cadence.sim.scenario import Scenario
from tests.helpers import TINY_SCENARIO

TINY = Scenario.load(TINY_SCENARIO)
OFFER = {"A910X": 4, "BI-V150": 4, "H800": 2}  # the tiny pool's devices, all of tp 1
BUDGET = 4 * 0.67 + 4 * 0.22 + 2 * 2.0  # what the tiny pool costs, catalog prices


def _every_mix() -> list[Outcome]:
    offers = offers_of(TINY, OFFER, {})
    s = Search(TINY, kinds_of(TINY, offers), BUDGET, "cadence", None)
    mixes = [m for m in product(range(5), range(5), range(3)) if s.fits(m)]
    return s.evaluate(mixes, TINY.workload.iterations, "every mix")


def test_the_search_finds_the_best_mix_running_every_mix_finds() -> None:
    found = search(TINY, offers_of(TINY, OFFER, {}), BUDGET)
    every = _every_mix()
    assert found.reference is not None and found.reference.mix == (4, 4, 2)
    best = max(
        (o for o in every if o.latency_p95_s <= found.reference.latency_p95_s),
        key=lambda o: o.tokens_per_dollar,
    )
    assert found.recommended is not None
    assert found.recommended.tokens_per_dollar >= 0.95 * best.tokens_per_dollar
    assert found.recommended.latency_p95_s <= found.reference.latency_p95_s
    assert found.evaluated < 2 * len(every)  # low-fidelity runs are cheap, but fewer


def test_no_mix_run_costs_more_than_the_budget_and_the_frontier_is_undominated() -> None:
    budget = 3.0
    found = search(TINY, offers_of(TINY, OFFER, {}), budget)
    assert found.finals and all(o.cost_per_hour <= budget for o in found.finals)
    ranks = pareto_ranks(found.finals)
    assert {o.mix for o in found.frontier} == {m for m, r in ranks.items() if r == 0}
    assert found.reference is None  # the tiny pool costs 7.56 an hour
    for o in found.frontier:
        assert not any(p.dominates(o) for p in found.finals)


def test_targets_no_mix_meets_are_said_not_met() -> None:
    found = search(TINY, offers_of(TINY, OFFER, {}), BUDGET, targets=Targets(latency_p95_s=0.001))
    assert found.recommended is None and "no mix searched meets the targets" in found.reason
    assert found.frontier  # the nearest are still shown


def test_one_more_worker_of_each_type_is_priced_and_run() -> None:
    before, each = marginal(TINY, offers_of(TINY, OFFER, {}))
    assert [m.accelerator for m in each] == ["A910X", "BI-V150", "H800"]
    assert [m.added_per_hour for m in each] == [0.67, 0.22, 2.0]
    h800 = each[2]
    assert h800.throughput_tok_s > before.throughput_tok_s  # the fastest type adds most
    assert h800.tokens_per_dollar != before.tokens_per_dollar


def test_every_mix_runs_at_a_fixed_size_even_from_an_autoscaled_scenario() -> None:
    raw = TINY.model_dump(exclude_unset=True) | {"autoscaling": {"budget_per_hour": 9.0}}
    autoscaled = Scenario.model_validate(raw)
    kinds = kinds_of(autoscaled, offers_of(autoscaled, OFFER, {}))
    fixed = scenario_of(autoscaled, kinds, (1, 2, 1), 1)
    assert fixed.autoscaling is None
    assert [(g.accelerator, g.devices) for g in fixed.groups] == [
        ("A910X", 1),
        ("BI-V150", 2),
        ("H800", 1),
    ]


@pytest.mark.parametrize(
    ("offers", "budget", "says"),
    [
        ([Offer("H800", 2, 2.0)], 1.0, "buys no worker: the cheapest costs 2/h"),
        ([Offer("Warp9", 2, 2.0)], 10.0, "unknown accelerator 'Warp9'"),
        ([], 10.0, "offer at least one accelerator type"),
        ([Offer("H800", 2, 2.0)], 0.0, "positive price per hour"),
        ([Offer("H800", 0, 2.0)], 10.0, "at least one device"),
    ],
)
def test_inputs_no_mix_can_meet_are_refused(offers: list[Offer], budget: float, says: str) -> None:
    with pytest.raises(AdviceError, match=says):
        search(TINY, offers, budget)


def test_a_type_with_no_price_asks_for_one() -> None:
    with pytest.raises(AdviceError, match="no price for H20: give --price H20="):
        offers_of(TINY, {"H20": 4}, {})
    assert offers_of(TINY, {"H20": 4}, {"H20": 1.5}) == [Offer("H20", 4, 1.5)]
