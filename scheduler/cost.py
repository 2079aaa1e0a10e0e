"""What a decode step and a prefill cost on one worker, as the scheduler needs to know it.

Three rules read it: placement keeps each worker below the batch at which its decode
turns compute-bound while another worker still is (beyond it a resident adds latency and
no throughput), the automatic floor and reserve size themselves to one control period of
growth at the worker's step rate, and work conservation moves a trajectory to a faster
worker only when the decode time it saves exceeds the prefill it costs there.

The model is the roofline the simulator's physics uses: a step reads the weights once and
every resident's KV, and is bounded below by its compute; a prefill is compute-bound.
The simulator fills it from the catalog, the runtime from the accelerator and the model;
a worker without one is placed by KV alone and gets the fixed floor and reserve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cadence.scheduler.errors import ConfigError


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds per decode step and per prefilled token on one worker.

    weights_s: reading the weights once; kv_token_s: reading one token of KV;
    seq_s: the compute of one sequence's step; overhead_s: fixed per step;
    prefill_token_s: the compute of prefilling one token.
    """

    weights_s: float
    kv_token_s: float
    seq_s: float
    overhead_s: float = 0.0
    prefill_token_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("weights_s", "kv_token_s", "seq_s", "overhead_s", "prefill_token_s"):
            value = getattr(self, name)
            if not value >= 0.0 or value == float("inf"):
                raise ConfigError(f"step cost {name} is {value}; it must be finite and >= 0")
        if self.weights_s + self.seq_s + self.overhead_s <= 0.0:
            raise ConfigError("a step cost of zero seconds cannot pace anything")

    def step_s(self, sequences: int, kv_tokens: int) -> float:
        """One decode step with `sequences` residents holding `kv_tokens` of KV."""
        memory = self.weights_s + self.kv_token_s * kv_tokens
        compute = self.seq_s * sequences
        return self.overhead_s + (memory if memory >= compute else compute)

    def saturated(self, sequences: int, kv_tokens: int) -> bool:
        """Whether a step of this batch takes over twice an empty step: its KV reads or
        its compute have outgrown reading the weights, so each resident added costs every
        other one more time than it adds throughput."""
        return self.step_s(sequences, kv_tokens) > 2.0 * (self.overhead_s + self.weights_s)

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_token_s * tokens


def floor_shortfall(
    h_min: int, cost: StepCost, max_seqs: int, capacity: int, *, period_s: float
) -> int | None:
    """The growth of one control period a pinned floor does not cover, or None.

    At the engine's sequence limit and a full KV cache (the slowest step, so the least
    growth), every resident grows one token a step; if that adds up to more than `h_min`
    in one period, the engine runs out of KV between two cycles and preempts. Auto floors
    never fall short: they are sized to exactly this growth.
    """
    step = cost.step_s(max_seqs, capacity)
    if step <= 0.0:
        return None
    growth = max_seqs * max(1, math.ceil(period_s / step))
    return growth if growth > h_min else None


def floor_warning(
    where: str, h_min: int, cost: StepCost, max_seqs: int, *, capacity: int, period_s: float
) -> str | None:
    """One sentence for a pinned floor below one period's growth on `where`, or None."""
    growth = floor_shortfall(h_min, cost, max_seqs, capacity, period_s=period_s)
    if growth is None:
        return None
    return (
        f"h_min {h_min:,} is below one control period's growth on {where} "
        f"({max_seqs} residents grow {growth:,} tokens in {period_s:g} s): the engine may "
        "preempt between cycles; leave h_min auto"
    )
