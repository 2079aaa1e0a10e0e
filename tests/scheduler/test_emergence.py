"""Emergence, held against the paper's own ablation.

The paper: without tight fit no specialization emerges, and in a heterogeneous pool the
faster worker comes to carry the longer mix. Both are measured on the toy pool over
fixed seeds, in the busy regime (every worker holding at least four residents, where
composition is a choice rather than an accident of a nearly empty pool).

Measured with these seeds (equal workers, KV 3,000 tokens): mean per-step coefficient of
variation of mean resident context across workers, tight fit 0.117 vs worst fit 0.051
(2.3x); with one worker twice as fast, its mean context over the others' 1.20x under
Cadence; the same on the costed pool. The assertions leave margin below those.

Each runs twice: as the paper's pool (no step cost known, fixed knobs) and as a KV-bound
pool that tells the scheduler its step costs, with auto knobs: decode never turns
compute-bound before KV runs out, so the compute-aware placement must leave tight fit,
and what emerges from it, as it was.
"""

from __future__ import annotations

import statistics
from typing import Literal

import pytest

from cadence.scheduler import Knobs, StepCost

from .toyworld import ToyConfig, ToyWorker, ToyWorld

SEEDS = range(8)
BUSY = 4


def _kv_bound(speed: int) -> StepCost:
    """A toy step (one token a resident per world step at speed 1): weights dominate, so
    its decode stays memory-bound far past what 3,000 tokens of KV can hold; a prefill
    does a thousand tokens in a step's time, as compute-bound prefills do."""
    return StepCost(
        weights_s=1.0 / speed,
        kv_token_s=1e-6 / speed,
        seq_s=1e-4 / speed,
        prefill_token_s=1e-3 / speed,
    )


def _run(
    fit: Literal["tight", "worst"],
    seed: int,
    speeds: tuple[int, ...],
    capacity: int,
    costed: bool = False,
) -> ToyWorld:
    cfg = ToyConfig(
        workers=[
            ToyWorker(f"w{i}", capacity, speed=s, cost=_kv_bound(s) if costed else None)
            for i, s in enumerate(speeds)
        ],
        batch_size=8,
        samples=8,
        iterations=4,
        knobs=Knobs(
            h_min=100,
            delta=30,
            eta=2,
            min_decode=16,
            auto_h_min=costed,
            auto_delta=costed,
            control_period_s=1.0,
        ),
        median_length=100,
        sigma=1.0,
        max_length=capacity - 200,
        seed=seed,
        fit=fit,
    )
    world = ToyWorld(cfg)
    assert world.run(200_000)
    return world


def _busy_steps(world: ToyWorld) -> list[dict[str, float]]:
    return [
        {k: v for k, v in means.items() if v is not None}
        for means, counts in zip(world.mean_context, world.counts, strict=True)
        if min(counts.values()) >= BUSY
    ]


def _spread(world: ToyWorld) -> float:
    steps = _busy_steps(world)
    assert steps, "the pool was never busy: the workload is too light for this test"
    return statistics.fmean(
        statistics.pstdev(m.values()) / statistics.fmean(m.values()) for m in steps
    )


def _fast_over_others(world: ToyWorld, fast: str) -> float:
    steps = _busy_steps(world)
    assert steps
    return statistics.fmean(
        m[fast] / statistics.fmean(v for k, v in m.items() if k != fast) for m in steps
    )


@pytest.mark.parametrize("costed", [False, True], ids=["paper", "kv-bound-costed"])
def test_tight_fit_specializes_equal_workers_and_worst_fit_does_not(costed: bool) -> None:
    equal = (1, 1, 1, 1)
    tight = statistics.fmean(_spread(_run("tight", s, equal, 3000, costed)) for s in SEEDS)
    worst = statistics.fmean(_spread(_run("worst", s, equal, 3000, costed)) for s in SEEDS)
    print(f"context spread across equal workers: tight fit {tight:.3f}, worst fit {worst:.3f}")
    assert tight >= 1.5 * worst, (tight, worst)


@pytest.mark.parametrize("costed", [False, True], ids=["paper", "kv-bound-costed"])
def test_the_faster_worker_carries_the_longer_mix(costed: bool) -> None:
    speeds = (2, 1, 1, 1)
    ratio = statistics.fmean(
        _fast_over_others(_run("tight", s, speeds, 2000, costed), "w0") for s in SEEDS
    )
    print(f"fast worker's mean context over the others': {ratio:.2f}x")
    assert ratio >= 1.1, ratio
