"""The simulator's physics: how long a decode step, a prefill and a KV transfer take.

Roofline models, as llm-analysis, LLM-Viewer, GenZ and Vidur use them (the figures and
their sources: docs/reference/catalog.md): a decode step reads the weights once plus the
KV of every resident, over the effective HBM bandwidth, and is bounded below by its
compute; a prefill is compute-bound. Efficiencies are parameters with the defaults cited below.
"""

from __future__ import annotations

from dataclasses import dataclass

from cadence.common.catalog import Accelerator, Figure, Model

# Defaults, each with its source:
BANDWIDTH_EFFICIENCY = Figure(0.75, "T", "calibrated simulators use 0.70-0.78 (A100, H100)")
PREFILL_MFU = Figure(0.6, "T", "calibrated simulators use 0.55-0.68")
DECODE_MFU = Figure(0.6, "E", "as prefill; the compute floor rarely binds in decode")
STEP_OVERHEAD_S = Figure(50e-6, "E", "tens of microseconds per step")
TP_DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class Efficiency:
    bandwidth: float = BANDWIDTH_EFFICIENCY.value
    prefill_mfu: float = PREFILL_MFU.value
    decode_mfu: float = DECODE_MFU.value
    step_overhead_s: float = STEP_OVERHEAD_S.value


@dataclass(frozen=True, slots=True)
class StepTerms:
    """A decode step's terms in seconds (weights, per KV token, per sequence, fixed) and
    prefill per token; the same fields as the scheduler's `StepCost`."""

    weights_s: float
    kv_token_s: float
    seq_s: float
    overhead_s: float
    prefill_token_s: float


@dataclass(frozen=True, slots=True)
class Deployment:
    """A model served on `tp` devices of one accelerator type: one worker."""

    model: Model
    accelerator: Accelerator
    tp: int
    kv_capacity_tokens: int
    efficiency: Efficiency

    def decode_step_s(self, batch: int, resident_tokens: int) -> float:
        """One decode step for `batch` residents holding `resident_tokens` of KV in all.

        t = overhead + max(memory term, compute term): weights once plus every resident's
        KV over the effective bandwidth of the tp devices, and 2 x active params x batch
        FLOPs over their effective compute.
        """
        eff = self.efficiency
        bw = self.tp * self.accelerator.bandwidth.value * eff.bandwidth
        memory = (self.model.weight_bytes + self.model.kv_bytes_per_token * resident_tokens) / bw
        flops = self.tp * self.accelerator.flops.value * eff.decode_mfu
        compute = 2.0 * self.model.active_params * batch / flops
        return eff.step_overhead_s + max(memory, compute)

    def step_terms(self) -> StepTerms:
        """`decode_step_s` term by term, and the linear part of `prefill_s` per token: what
        the scheduler's `StepCost` and a worker's reported step cost carry."""
        eff = self.efficiency
        bw = self.tp * self.accelerator.bandwidth.value * eff.bandwidth
        flops = self.tp * self.accelerator.flops.value
        return StepTerms(
            weights_s=self.model.weight_bytes / bw,
            kv_token_s=self.model.kv_bytes_per_token / bw,
            seq_s=2.0 * self.model.active_params / (flops * eff.decode_mfu),
            overhead_s=eff.step_overhead_s,
            prefill_token_s=2.0 * self.model.active_params / (flops * eff.prefill_mfu),
        )

    def prefill_s(self, tokens: int, cached: int = 0) -> float:
        """Prefill `tokens` new tokens after `cached` tokens already in KV (re-prefill of a
        moved trajectory passes cached = 0 and tokens = its whole context).

        FLOPs ~ 2 x params x T + 2 x layers x q_dim x T x (T + 2 x cached): the linear
        layers plus attention of each new token over everything before it.
        """
        m = self.model
        t = float(tokens)
        work = 2.0 * m.active_params * t + 2.0 * m.layers * m.q_dim * t * (t + 2.0 * cached)
        return work / (self.tp * self.accelerator.flops.value * self.efficiency.prefill_mfu)


def kv_capacity_tokens(
    model: Model,
    accelerator: Accelerator,
    tp: int,
    memory_utilisation: float = 0.9,
    reserve_bytes: float = 2e9,
) -> int:
    """KV tokens a worker of `tp` devices holds: what memory leaves after the weights and
    a per-device reserve (activations, CUDA graphs, fragmentation), as vLLM sizes it."""
    usable = tp * (accelerator.memory.value * memory_utilisation - reserve_bytes)
    free = usable - model.weight_bytes
    return max(0, int(free // model.kv_bytes_per_token))


def deploy(
    model: Model,
    accelerator: Accelerator,
    min_kv_tokens: int,
    *,
    efficiency: Efficiency | None = None,
    memory_utilisation: float = 0.9,
    reserve_bytes: float = 2e9,
) -> Deployment:
    """The smallest tensor-parallel degree whose KV capacity reaches `min_kv_tokens`
    (the paper: the minimum parallelism that fits, to maximise independent workers)."""
    for tp in TP_DEGREES:
        cap = kv_capacity_tokens(model, accelerator, tp, memory_utilisation, reserve_bytes)
        if cap >= min_kv_tokens:
            return Deployment(model, accelerator, tp, cap, efficiency or Efficiency())
    raise ValueError(
        f"{model.name} does not fit on {max(TP_DEGREES)} x {accelerator.name} with "
        f"{min_kv_tokens} KV tokens to spare"
    )


# The modelled intra-cluster link a pull crosses: one 200G NIC, 21.7 GB/s measured
# (docs/reference/catalog.md), as the simulator's default; the emulated engine's link.
LINK_BYTES_PER_S = 21.7e9


def transfer_s(kv_tokens: int, model: Model, link_bytes_per_s: float) -> float:
    """Moving a trajectory's KV over a link (same accelerator type only)."""
    return kv_tokens * model.kv_bytes_per_token / link_bytes_per_s
