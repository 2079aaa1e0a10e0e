"""A simulation scenario: the pool, the model, the workload, the trainer and the knobs.

One pydantic model validates the YAML file, so a bad file is refused naming the field
path and the reason. Every physics figure has a cited default (see `physics` and
`catalog`) and may be overridden here; custom accelerator types carry their own figures.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from cadence.sim.catalog import ACCELERATORS, GB, MODELS, TB, Accelerator, Figure
from cadence.sim.physics import (
    BANDWIDTH_EFFICIENCY,
    DECODE_MFU,
    PREFILL_MFU,
    STEP_OVERHEAD_S,
    Efficiency,
)
from cadence.sim.workload import LengthModel, MultiTurn, Sample, generate_group


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CustomAccelerator(_Strict):
    """An accelerator type the catalog lacks: its figures, all estimates (E)."""

    memory_gb: float = Field(gt=0)
    bandwidth_tb_s: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0)


class Group(_Strict):
    """Devices of one accelerator type. Each worker uses the smallest tensor-parallel
    degree that fits the model with `min_kv_tokens` to spare, so `devices` / tp workers."""

    name: str = Field(min_length=1)
    accelerator: str = Field(min_length=1)
    devices: int = Field(ge=1)
    affinity: int = 0
    price_per_hour: float | None = Field(default=None, ge=0)
    custom: CustomAccelerator | None = None

    @model_validator(mode="after")
    def _known(self) -> Self:
        if self.custom is None and self.accelerator not in ACCELERATORS:
            known = ", ".join(sorted(ACCELERATORS))
            raise ValueError(
                f"unknown accelerator {self.accelerator!r}: use one of {known}, "
                "or give its figures under 'custom'"
            )
        return self

    def resolve(self) -> Accelerator:
        if self.custom is not None:
            c = self.custom
            return Accelerator(
                self.accelerator,
                Figure(c.memory_gb * GB, "E", "scenario"),
                Figure(c.bandwidth_tb_s * TB, "E", "scenario"),
                Figure(c.bf16_tflops * 1e12, "E", "scenario"),
                None if self.price_per_hour is None else Figure(self.price_per_hour, "E"),
                cluster=self.accelerator,
            )
        base = ACCELERATORS[self.accelerator]
        if self.price_per_hour is None:
            return base
        return Accelerator(
            base.name,
            base.memory,
            base.bandwidth,
            base.flops,
            Figure(self.price_per_hour, "E", "scenario"),
            base.cluster,
        )


class Physics(_Strict):
    bandwidth_efficiency: float = Field(default=BANDWIDTH_EFFICIENCY.value, gt=0, le=1)
    prefill_mfu: float = Field(default=PREFILL_MFU.value, gt=0, le=1)
    decode_mfu: float = Field(default=DECODE_MFU.value, gt=0, le=1)
    step_overhead_s: float = Field(default=STEP_OVERHEAD_S.value, ge=0)
    memory_utilisation: float = Field(default=0.9, gt=0, le=1)
    reserve_gb: float = Field(default=2.0, ge=0)
    # The KV a worker must hold; by default what no stranding needs:
    # max_model_len + h_min + delta (DESIGN.md, "Headroom and thresholds").
    min_kv_tokens: int | None = Field(default=None, ge=1)
    max_batch: int = Field(default=256, ge=1)
    # The paper's testbed: 8 x 200 Gbps RDMA in a cluster (one 200G NIC is 21.7 GB/s
    # measured, CATALOG.md), a 20 Gbps link across clusters.
    intra_cluster_gb_s: float = Field(default=21.7, gt=0)
    inter_cluster_gb_s: float = Field(default=2.5, gt=0)
    kv_transfer: bool = True  # moves within one accelerator type send KV, else re-prefill

    def efficiency(self) -> Efficiency:
        return Efficiency(
            bandwidth=self.bandwidth_efficiency,
            prefill_mfu=self.prefill_mfu,
            decode_mfu=self.decode_mfu,
            step_overhead_s=self.step_overhead_s,
        )


class Workload(_Strict):
    prompts_per_batch: int = Field(default=512, ge=1)  # B, in prompt groups
    samples_per_prompt: int = Field(default=16, ge=1)
    iterations: int = Field(default=5, ge=1)
    prompt_tokens: int = Field(default=512, ge=1)
    median_response_tokens: float = Field(default=1_500, gt=0)
    sigma_between_groups: float = Field(default=0.75, ge=0)
    sigma_within_group: float = Field(default=0.6, ge=0)
    multi_turn_share: float = Field(default=0.0, ge=0, le=1)
    max_tool_calls: int = Field(default=12, ge=1)
    env_latency_s: float = Field(default=2.0, ge=0)
    observation_tokens: int = Field(default=128, ge=0)


class Trainer(_Strict):
    update_seconds: float = Field(default=60.0, ge=0)
    weights_link_gb_s: float = Field(default=2.5, gt=0)  # trainer to the pool


class Scheduling(_Strict):
    eta: int = Field(default=1, ge=0)
    delta: int = Field(default=512, ge=0)
    h_min: int = Field(default=2_048, ge=0)
    min_decode: int = Field(default=64, ge=1)
    control_period_s: float = Field(default=1.0, gt=0)


class Scenario(_Strict):
    name: str = Field(min_length=1)
    model: str
    max_model_len: int = Field(ge=1)
    groups: list[Group] = Field(min_length=1)
    physics: Physics = Physics()
    workload: Workload = Workload()
    trainer: Trainer = Trainer()
    scheduling: Scheduling = Scheduling()
    seed: int = 0

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}: use one of {', '.join(MODELS)}")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError("group names must be unique")
        if self.workload.prompt_tokens >= self.max_model_len:
            raise ValueError("prompt_tokens must be below max_model_len")
        return self

    def length_model(self) -> LengthModel:
        w = self.workload
        return LengthModel(
            w.median_response_tokens,
            w.sigma_between_groups,
            w.sigma_within_group,
            self.max_model_len,
        )

    def multi_turn(self) -> MultiTurn:
        w = self.workload
        return MultiTurn(
            w.multi_turn_share, w.max_tool_calls, w.env_latency_s, w.observation_tokens
        )

    def groups_of_samples(self, rng: random.Random) -> Iterator[list[Sample]]:
        """Prompt groups without end, in admission order: drawn from `rng` exactly as the
        simulator admits them, so a run and a replay see the same samples."""
        lengths, turns = self.length_model(), self.multi_turn()
        w = self.workload
        for group in itertools.count():
            yield generate_group(
                rng,
                group,
                w.samples_per_prompt,
                prompt_tokens=w.prompt_tokens,
                lengths=lengths,
                multi_turn=turns,
            )

    def traced_sample(self) -> str:
        """The trajectory Figure 14 follows: the longest single-turn sample of the second
        batch (the first starts on an empty pool), or of the first when there is one."""
        w = self.workload
        batch = min(1, w.iterations - 1)
        best: Sample | None = None
        for samples in itertools.islice(
            self.groups_of_samples(random.Random(self.seed)), (batch + 1) * w.prompts_per_batch
        ):
            for s in samples:
                if s.group // w.prompts_per_batch != batch or s.tool_calls:
                    continue
                if best is None or s.response_tokens > best.response_tokens:
                    best = s
        if best is None:  # every sample of the batch calls tools
            return f"g{batch * w.prompts_per_batch}s0"
        return best.id

    def min_kv_tokens(self) -> int:
        s = self.scheduling
        needed = self.max_model_len + s.h_min + s.delta
        return self.physics.min_kv_tokens or needed

    @staticmethod
    def load(path: Path) -> Scenario:
        """Read and validate a scenario YAML file (errors: OSError, yaml.YAMLError,
        pydantic.ValidationError)."""
        return Scenario.model_validate(yaml.safe_load(path.read_text()))
