"""The synthetic workload: capped, correlated within groups, seeded, with tool calls."""

from __future__ import annotations

import random
import statistics

from cadence.sim.workload import (
    Component,
    Empirical,
    EmpiricalLengths,
    Exponential,
    LengthLaw,
    LengthModel,
    Lognormal,
    MixtureLengths,
    MultiTurn,
    Sample,
    generate_group,
    shape_of,
)


def _workload(seed: int, groups: int = 256, samples: int = 16, **kw: float) -> list[Sample]:
    rng = random.Random(seed)
    lengths = LengthModel(median_tokens=kw.get("median", 1500.0))
    turns = MultiTurn(share=kw.get("share", 0.0))
    out: list[Sample] = []
    for g in range(groups):
        out += generate_group(
            rng,
            g,
            samples,
            prompt_tokens=512,
            lengths=lengths,
            max_model_len=32_768,
            multi_turn=turns,
        )
    return out


def test_same_seed_same_workload_and_lengths_fit_the_model_length() -> None:
    a, b = _workload(3), _workload(3)
    assert a == b
    assert all(1 <= s.response_tokens <= 32_768 - 512 for s in a)


def test_lengths_are_correlated_within_a_group() -> None:
    samples = _workload(5)
    by_group: dict[int, list[float]] = {}
    for s in samples:
        by_group.setdefault(s.group, []).append(float(s.response_tokens))
    within = statistics.fmean(statistics.pvariance(v) for v in by_group.values())
    overall = statistics.pvariance([float(s.response_tokens) for s in samples])
    assert within < 0.8 * overall


def test_default_shape_is_heavy_tailed() -> None:
    shape = shape_of(_workload(11), 32_768)
    assert 6 <= shape.p99_over_median <= 14
    assert 0.5 <= shape.slowest_tenth_time_share <= 0.95


def test_tool_calls_stay_inside_the_response_and_the_model_length() -> None:
    samples = _workload(7, share=1.0)
    assert all(1 <= len(s.tool_calls) <= 12 for s in samples)
    for s in samples:
        assert all(0 < c < max(2, s.response_tokens) for c in s.tool_calls)
        assert len(s.env_latencies_s) == len(s.tool_calls)
        total = s.prompt_tokens + s.response_tokens + len(s.tool_calls) * s.observation_tokens
        assert total <= 32_768


def _draw(law: LengthLaw, groups: int = 400, samples: int = 16, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        batch = generate_group(
            rng,
            g,
            samples,
            prompt_tokens=64,
            lengths=law,
            max_model_len=65_536,
            multi_turn=MultiTurn(),
        )
        out.append([s.response_tokens for s in batch])
    return out


def test_a_mixture_gives_each_component_its_share() -> None:
    law = MixtureLengths((Component(0.7, 800, 0.3, 0.3), Component(0.3, 12_000, 0.3, 0.3)))
    lengths = [n for group in _draw(law) for n in group]
    long_share = sum(n > 3_000 for n in lengths) / len(lengths)
    assert 0.26 <= long_share <= 0.34
    short = sorted(n for n in lengths if n <= 3_000)
    assert 600 <= short[len(short) // 2] <= 1_050


def test_an_empirical_law_replays_the_recorded_quantiles_with_groups_correlated() -> None:
    recorded = [100.0 * (i + 1) for i in range(100)]  # uniform 100 .. 10,000
    by_group = _draw(EmpiricalLengths(tuple(recorded), group_correlation=0.6))
    lengths = sorted(n for group in by_group for n in group)
    assert set(lengths) <= {int(x) for x in recorded}
    for q in (0.1, 0.5, 0.9):
        assert abs(lengths[int(q * len(lengths))] - 10_000 * q) <= 600
    within = statistics.fmean(statistics.pvariance(g) for g in by_group)
    assert within < 0.7 * statistics.pvariance(lengths)
    uncorrelated = _draw(EmpiricalLengths(tuple(recorded), group_correlation=0.0))
    within_none = statistics.fmean(statistics.pvariance(g) for g in uncorrelated)
    assert within_none > 0.9 * statistics.pvariance([n for g in uncorrelated for n in g])


def test_latency_laws_have_the_centre_they_are_given() -> None:
    rng = random.Random(3)
    expo = [Exponential(2.0).draw(rng) for _ in range(4_000)]
    logn = sorted(Lognormal(5.0, 1.0).draw(rng) for _ in range(4_000))
    recorded = Empirical((0.5, 1.5, 30.0))
    assert 1.8 <= statistics.fmean(expo) <= 2.2
    assert 4.5 <= logn[len(logn) // 2] <= 5.5
    assert {recorded.draw(rng) for _ in range(200)} == {0.5, 1.5, 30.0}
    assert Exponential(0.0).draw(rng) == 0.0
