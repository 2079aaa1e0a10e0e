"""The synthetic workload: capped, correlated within groups, seeded, with tool calls."""

from __future__ import annotations

import random
import statistics

from cadence.sim.workload import LengthModel, MultiTurn, Sample, generate_group, shape_of


def _workload(seed: int, groups: int = 256, samples: int = 16, **kw: float) -> list[Sample]:
    rng = random.Random(seed)
    lengths = LengthModel(median_tokens=kw.get("median", 1500.0), max_model_len=32_768)
    turns = MultiTurn(share=kw.get("share", 0.0))
    out: list[Sample] = []
    for g in range(groups):
        out += generate_group(rng, g, samples, prompt_tokens=512, lengths=lengths, multi_turn=turns)
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
