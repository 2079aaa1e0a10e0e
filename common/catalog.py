"""Accelerators and models the simulator knows by name, with where each figure came from.

Every figure carries its source letter: V vendor, T third party,
D derived from vendor configuration, E estimate (the note says its basis). A reader can
tell a datasheet from a guess, and a scenario can override any of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Source = Literal["V", "T", "D", "E"]

GB = 1e9
GIB = 2**30
TB = 1e12


@dataclass(frozen=True, slots=True)
class Figure:
    """A number and where it came from."""

    value: float
    source: Source
    note: str = ""


@dataclass(frozen=True, slots=True)
class Accelerator:
    """One device: memory (bytes), HBM bandwidth (bytes/s), dense BF16 FLOP/s, price."""

    name: str
    memory: Figure
    bandwidth: Figure
    flops: Figure
    price_per_hour: Figure | None
    cluster: str  # devices of one type sit in one cluster (the paper's testbed)


@dataclass(frozen=True, slots=True)
class Model:
    """A dense or MoE decoder, from its config.json (source D)."""

    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    params: float
    active_params: float

    @property
    def weight_bytes(self) -> float:
        """BF16 weights: two bytes a parameter."""
        return 2.0 * self.params

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head, BF16: 2 x layers x kv_heads x head_dim x 2."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim


def _acc(
    name: str,
    memory: Figure,
    bandwidth: Figure,
    flops: Figure,
    price: Figure | None,
) -> Accelerator:
    return Accelerator(name, memory, bandwidth, flops, price, cluster=name)


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        _acc(
            "H100",
            Figure(80 * GB, "V"),
            Figure(3.35 * TB, "V"),
            Figure(989e12, "V"),
            Figure(2.45, "T", "public cloud rates 1.90-2.99 (AWS 3.93); midpoint"),
        ),
        _acc(
            "H800",
            Figure(80 * GB, "T"),
            Figure(3.35 * TB, "T"),
            Figure(989e12, "T"),
            Figure(2.00, "E", "no public rate found; about an H100, as the paper's digest"),
        ),
        _acc(
            "H200",
            Figure(141 * GB, "T"),
            Figure(4.8 * TB, "T"),
            Figure(989e12, "T"),
            Figure(3.29, "T"),
        ),
        _acc(
            "A100-80GB",
            Figure(80 * GB, "T"),
            Figure(2.039 * TB, "T"),
            Figure(312e12, "T"),
            Figure(1.99, "T", "public cloud rates 1.49-2.49; midpoint"),
        ),
        _acc(
            "L40S",
            Figure(48 * GB, "T"),
            Figure(0.864 * TB, "T"),
            Figure(362e12, "T"),
            Figure(1.58, "T"),
        ),
        _acc(
            "H20",
            Figure(96 * GB, "T"),
            Figure(4.0 * TB, "T"),
            Figure(148e12, "T"),
            None,
        ),
        _acc(
            "MI300X",
            Figure(192 * GB, "T"),
            Figure(5.3 * TB, "T"),
            Figure(1307e12, "T"),
            Figure(1.99, "T", "median public rate"),
        ),
        _acc(
            "A910X",
            Figure(64 * GIB, "V", "taken as Ascend 910B2C (A2 class); unconfirmed"),
            Figure(1.6 * TB, "V"),
            Figure(354e12, "V", "cube units"),
            Figure(0.67, "E", "the paper's Table 1 as a secondary digest reports it"),
        ),
        _acc(
            "Ascend910B3",
            Figure(64 * GIB, "V"),
            Figure(1.6 * TB, "E", "not found; as the 910B2"),
            Figure(295e12, "D"),
            None,
        ),
        _acc(
            "Ascend910B4",
            Figure(32 * GIB, "V"),
            Figure(1.6 * TB, "E", "not found; as the 910B2"),
            Figure(246e12, "D"),
            None,
        ),
        _acc(
            "BI-V150",
            Figure(64 * GB, "V"),
            Figure(1.6 * TB, "T", "the digest's Table 1 says 800 GB/s for one of two dies"),
            Figure(192e12, "T", "FP16"),
            Figure(0.22, "E", "the paper's Table 1 as a secondary digest reports it"),
        ),
    )
}


MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        Model("Qwen3-8B", 36, 32, 8, 128, 4096, 151936, 8.19e9, 8.19e9),
        Model("Qwen3-14B", 40, 40, 8, 128, 5120, 151936, 14.77e9, 14.77e9),
        Model("Qwen3-32B", 64, 64, 8, 128, 5120, 151936, 32.76e9, 32.76e9),
        Model("Qwen3-30B-A3B", 48, 32, 4, 128, 2048, 151936, 30.5e9, 3.35e9),
        Model("Qwen2.5-7B", 28, 28, 4, 128, 3584, 152064, 7.62e9, 7.62e9),
        Model("Llama-3.1-8B", 32, 32, 8, 128, 4096, 128256, 8.03e9, 8.03e9),
    )
}
