"""Fidelity of the simulator's physics against published anchors."""

from __future__ import annotations

import pytest

from cadence.common.catalog import ACCELERATORS, MODELS
from cadence.common.physics import Efficiency, deploy, kv_capacity_tokens, transfer_s


@pytest.mark.parametrize(
    ("model", "kv_bytes"),
    [
        ("Qwen3-8B", 147_456),
        ("Qwen3-14B", 163_840),
        ("Qwen3-32B", 262_144),
        ("Qwen3-30B-A3B", 98_304),
        ("Qwen2.5-7B", 57_344),
        ("Llama-3.1-8B", 131_072),
    ],
)
def test_kv_bytes_per_token_match_the_catalog(model: str, kv_bytes: int) -> None:
    assert MODELS[model].kv_bytes_per_token == kv_bytes


def test_weights_only_decode_floor_of_qwen3_8b_on_h800() -> None:
    """Published: about 6.5 ms per step at 75% of 3.35 TB/s (16.4 GB of weights)."""
    d = deploy(MODELS["Qwen3-8B"], ACCELERATORS["H800"], min_kv_tokens=1)
    no_overhead = Efficiency(bandwidth=0.75, step_overhead_s=0.0)
    step = type(d)(d.model, d.accelerator, d.tp, d.kv_capacity_tokens, no_overhead)
    assert d.tp == 1
    assert step.decode_step_s(batch=1, resident_tokens=0) == pytest.approx(6.52e-3, rel=0.01)


def test_decode_step_grows_with_resident_kv() -> None:
    d = deploy(MODELS["Qwen3-8B"], ACCELERATORS["H800"], min_kv_tokens=1)
    empty = d.decode_step_s(batch=64, resident_tokens=0)
    full = d.decode_step_s(batch=64, resident_tokens=200_000)
    # 200K tokens x 147,456 B = 29.5 GB, about 1.8x the weights.
    assert full / empty == pytest.approx(1 + 29.49 / 16.38, rel=0.02)


def test_qwen3_32b_on_one_h800_leaves_about_26k_tokens() -> None:
    """The issue's anchor: Qwen3-32B on one H800 leaves only about 26K tokens of KV."""
    cap = kv_capacity_tokens(
        MODELS["Qwen3-32B"], ACCELERATORS["H800"], tp=1, memory_utilisation=0.92, reserve_bytes=1e9
    )
    assert 20_000 <= cap <= 32_000


def test_smallest_tp_that_leaves_the_minimum_kv() -> None:
    model, h800 = MODELS["Qwen3-32B"], ACCELERATORS["H800"]
    assert deploy(model, h800, min_kv_tokens=16_000).tp == 1
    assert deploy(model, h800, min_kv_tokens=100_000).tp == 2
    with pytest.raises(ValueError, match="does not fit"):
        deploy(model, h800, min_kv_tokens=10**8)


def test_transfer_over_the_inter_cluster_link() -> None:
    """Published: Qwen3-8B at 8K context is 1.21 GB; 0.48 s over 20 Gbps (2.5 GB/s)."""
    assert transfer_s(8192, MODELS["Qwen3-8B"], 2.5e9) == pytest.approx(0.48, rel=0.02)


def test_re_prefill_of_8k_on_h800_is_a_fraction_of_a_second() -> None:
    """Estimated: 0.28 s (E) for Qwen3-8B, 8K context, on an H800."""
    d = deploy(MODELS["Qwen3-8B"], ACCELERATORS["H800"], min_kv_tokens=1)
    assert 0.1 < d.prefill_s(8192) < 0.5
