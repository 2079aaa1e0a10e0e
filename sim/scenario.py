"""A simulation scenario: the pool, the model, the workload, the trainer and the knobs.

One pydantic model validates the YAML file, so a bad file is refused naming the field
path and the reason, before anything runs: that includes a group whose devices yield no
worker and knobs no worker could hold (`deployments`). Every number has a finite range,
so no file can ask for a run that never ends. Every physics figure has a cited default
(see `physics` and `catalog`) and may be overridden here; custom accelerator types carry
their own figures. Files a scenario names (recorded lengths or latencies) are read
relative to the scenario file.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    Field,
    PlainValidator,
    PrivateAttr,
    WithJsonSchema,
    model_validator,
)

from cadence.common.catalog import ACCELERATORS, GB, MODELS, TB, Accelerator, Figure
from cadence.common.inputs import read_input
from cadence.common.limits import (
    MAX_ETA,
    MAX_ITERATIONS,
    MAX_PROMPTS_PER_BATCH,
    MAX_SAMPLES_PER_PROMPT,
)
from cadence.common.physics import (
    BANDWIDTH_EFFICIENCY,
    DECODE_MFU,
    PREFILL_MFU,
    STEP_OVERHEAD_S,
    Deployment,
    Efficiency,
    deploy,
)
from cadence.common.pool import Affinity, CustomAccelerator, PricePerHour, TensorParallel
from cadence.scheduler.cost import StepCost, floor_warning
from cadence.scheduler.snapshot import Knobs, Migration
from cadence.sim.laws import (
    MAX_DEVICES,
    MAX_SECONDS,
    MAX_TOKENS,
    LatencyLawSpec,
    LengthLawSpec,
    Strict,
)
from cadence.sim.workload import (
    Exponential,
    LengthLaw,
    LengthModel,
    MultiTurn,
    Sample,
    generate_group,
)


def _auto_or_tokens(value: object) -> int | Literal["auto"]:
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
        raise ValueError(
            f"must be auto or a number of tokens from 0 to {MAX_TOKENS:,}, not {value!r}"
        )
    return value


# `h_min` and `delta`: auto, or pinned tokens (one sentence when neither).
AutoOrTokens = Annotated[
    int | Literal["auto"],
    PlainValidator(_auto_or_tokens),
    WithJsonSchema(
        {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "enum": ["auto"]}]}
    ),
]


def step_cost(deployment: Deployment) -> StepCost:
    """The scheduler's view of a modelled worker's costs (its roofline's terms)."""
    return StepCost(**asdict(deployment.step_terms()))


def transfer_group(deployment: Deployment) -> str:
    """Workers whose KV layouts match, so one can pull the other's KV blocks: the same
    model (one per scenario), accelerator type and tensor-parallel degree."""
    return f"{deployment.model.name}/{deployment.accelerator.name}/tp{deployment.tp}"


class StepEfficiency(Strict):
    """A group's own decode-step figures, where they differ from the scenario's physics:
    what a trace's fit measured on this type (`sim/replay.py`)."""

    bandwidth_efficiency: float | None = Field(default=None, gt=0, le=1)
    step_overhead_s: float | None = Field(default=None, ge=0, le=1)


class Group(Strict):
    """Devices of one accelerator type. Each worker uses the smallest tensor-parallel
    degree that fits the model with `min_kv_tokens` to spare, so `devices` / tp workers."""

    name: str = Field(min_length=1)
    accelerator: str = Field(min_length=1)
    devices: int = Field(ge=1, le=MAX_DEVICES)
    affinity: Affinity = 0
    price_per_hour: PricePerHour | None = None
    custom: CustomAccelerator | None = None
    # A worker's tensor-parallel degree and KV tokens as a deployment pinned them (what
    # `cadence run` and the operator start workers with); unset: sized as above.
    tensor_parallel: TensorParallel | None = None
    kv_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS * 64)
    efficiency: StepEfficiency | None = None  # unset: the scenario's physics
    # Under `autoscaling`: the fewest and most workers the group may have (most unset:
    # the workers its devices make, so it cannot grow).
    min_workers: int = Field(default=0, ge=0, le=MAX_DEVICES)
    max_workers: int | None = Field(default=None, ge=1, le=MAX_DEVICES)

    @model_validator(mode="after")
    def _known(self) -> Self:
        if (self.tensor_parallel is None) != (self.kv_tokens is None):
            raise ValueError("give tensor_parallel and kv_tokens together, or neither")
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


class Physics(Strict):
    bandwidth_efficiency: float = Field(default=BANDWIDTH_EFFICIENCY.value, gt=0, le=1)
    prefill_mfu: float = Field(default=PREFILL_MFU.value, gt=0, le=1)
    decode_mfu: float = Field(default=DECODE_MFU.value, gt=0, le=1)
    step_overhead_s: float = Field(default=STEP_OVERHEAD_S.value, ge=0, le=1)
    memory_utilisation: float = Field(default=0.9, gt=0, le=1)
    reserve_gb: float = Field(default=2.0, ge=0, le=1e4)
    # The KV a worker must hold; by default what no stranding needs:
    # max_model_len + h_min + delta (docs/architecture.md, "Headroom and thresholds").
    min_kv_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS * 4)
    max_batch: int = Field(default=256, ge=1, le=65_536)
    # The paper's testbed: 8 x 200 Gbps RDMA in a cluster (one 200G NIC is 21.7 GB/s
    # measured), a 20 Gbps link across clusters.
    intra_cluster_gb_s: float = Field(default=21.7, ge=1e-3, le=1e9)
    inter_cluster_gb_s: float = Field(default=2.5, ge=1e-3, le=1e9)
    # The KV link exists: workers of one transfer group (model, accelerator type,
    # tensor-parallel degree) can pull each other's KV over the intra-cluster link, and
    # `scheduling.migration` chooses whether a move does. False: every move re-prefills.
    kv_transfer: bool = True
    # How fast a worker loads a new version's weights when it advances; unset: over the
    # intra-cluster link.
    weights_load_gb_s: float | None = Field(default=None, ge=1e-3, le=1e9)

    def efficiency(self, own: StepEfficiency | None = None) -> Efficiency:
        """The efficiencies a worker runs at: these, or a group's `own` where it has them."""
        bandwidth, overhead = self.bandwidth_efficiency, self.step_overhead_s
        if own is not None:
            bandwidth = own.bandwidth_efficiency or bandwidth
            overhead = overhead if own.step_overhead_s is None else own.step_overhead_s
        return Efficiency(
            bandwidth=bandwidth,
            prefill_mfu=self.prefill_mfu,
            decode_mfu=self.decode_mfu,
            step_overhead_s=overhead,
        )


class Workload(Strict):
    # B, in prompt groups
    prompts_per_batch: int = Field(default=512, ge=1, le=MAX_PROMPTS_PER_BATCH)
    samples_per_prompt: int = Field(default=16, ge=1, le=MAX_SAMPLES_PER_PROMPT)
    iterations: int = Field(default=5, ge=1, le=MAX_ITERATIONS)
    prompt_tokens: int = Field(default=512, ge=1, le=MAX_TOKENS)
    # The default length law (lognormal); `response_lengths` replaces it when given.
    median_response_tokens: float = Field(default=1_500, gt=0, le=MAX_TOKENS)
    sigma_between_groups: float = Field(default=0.75, ge=0, le=5)
    sigma_within_group: float = Field(default=0.6, ge=0, le=5)
    response_lengths: LengthLawSpec | None = None
    multi_turn_share: float = Field(default=0.0, ge=0, le=1)
    max_tool_calls: int = Field(default=12, ge=1, le=1_000)
    # The mean of an exponential; `env_latency` replaces it when given.
    env_latency_s: float = Field(default=2.0, ge=0, le=MAX_SECONDS)
    env_latency: LatencyLawSpec | None = None
    observation_tokens: int = Field(default=128, ge=0, le=MAX_TOKENS)
    # A workload that shifts as training proceeds: each batch's responses are (1 +
    # growth) times as long as the last batch's draws (answers grow as a policy learns
    # to reason at length), capped by max_model_len.
    response_growth: float = Field(default=0.0, ge=-0.9, le=10.0)

    @model_validator(mode="after")
    def _one_law(self) -> Self:
        given = self.model_fields_set
        if self.response_lengths is not None and given & {
            "median_response_tokens",
            "sigma_between_groups",
            "sigma_within_group",
        }:
            raise ValueError(
                "give either response_lengths or median_response_tokens and the sigmas, not both"
            )
        if self.env_latency is not None and "env_latency_s" in given:
            raise ValueError("give either env_latency or env_latency_s, not both")
        return self


class Autoscaling(Strict):
    """The pool resizes itself during the run, by the operator's rule
    (`scheduler/autoscale.py`); each group between its `min_workers` and `max_workers`."""

    budget_per_hour: float = Field(gt=0, le=1e9)
    objective: Literal["throughput_per_dollar", "tail_latency"] = "throughput_per_dollar"
    period_s: float = Field(default=30.0, gt=0, le=3_600)
    scale_up_stabilization_s: float = Field(default=60.0, ge=0, le=86_400)
    scale_down_stabilization_s: float = Field(default=300.0, ge=0, le=86_400)
    max_step: int = Field(default=4, ge=1, le=1_000)
    target_utilization: float = Field(default=0.75, gt=0, le=1)
    demand_memory_s: float = Field(default=900.0, ge=0, le=86_400)
    # From a group's scale-out to its new worker taking work: the pod, the engine and
    # the model's weights (the worker then loads the serving version's, as any does).
    start_s: float = Field(default=60.0, ge=0, le=3_600)


class TrainerSettings(Strict):
    update_seconds: float = Field(default=60.0, ge=0, le=MAX_SECONDS)
    weights_link_gb_s: float = Field(default=2.5, ge=1e-3, le=1e9)  # trainer to the pool


# What the pool is sized for when h_min or delta is auto: the architecture's defaults.
SIZING_H_MIN = 2_048
SIZING_DELTA = 512


class Scheduling(Strict):
    """The run's knobs. `h_min` and `delta` are `auto` (derived per worker each cycle
    from its step cost and the control period) or pinned token counts; the pool is sized
    with the pinned values, or under auto with `sizing_h_min` and `sizing_delta`
    (`SIZING_H_MIN` and `SIZING_DELTA` unless the scenario says otherwise: a scenario made
    from a TrainingRun sizes as the operator sizes that run's workers)."""

    eta: int = Field(default=1, ge=0, le=MAX_ETA)
    delta: AutoOrTokens = "auto"
    h_min: AutoOrTokens = "auto"
    min_decode: int = Field(default=64, ge=1, le=MAX_TOKENS)
    control_period_s: float = Field(default=1.0, ge=1e-3, le=3_600)
    # Start concentration even when no newer version has fresh work for the emptied
    # source (an experiment switch of the Cadence policy, off by default).
    concentrate_without_fresh: bool = False
    # How a departed trajectory moves (the TrainingRun's migration): auto pulls its KV
    # where the pair's transfer groups match and re-prefills otherwise, kv moves it only
    # where it can be pulled (unless no such worker serves its version), reprefill never
    # pulls. `cadence sim --migration` overrides it.
    migration: Migration = "auto"
    sizing_h_min: int = Field(default=SIZING_H_MIN, ge=0, le=MAX_TOKENS)
    sizing_delta: int = Field(default=SIZING_DELTA, ge=0, le=MAX_TOKENS)

    @property
    def h_min_tokens(self) -> int:
        return self.sizing_h_min if self.h_min == "auto" else self.h_min

    @property
    def delta_tokens(self) -> int:
        return self.sizing_delta if self.delta == "auto" else self.delta

    def knobs(self) -> Knobs:
        return Knobs.from_spec(
            self.h_min,
            self.delta,
            sizing=(self.sizing_h_min, self.sizing_delta),
            eta=self.eta,
            min_decode=self.min_decode,
            concentrate_without_fresh=self.concentrate_without_fresh,
            control_period_s=self.control_period_s,
            migration=self.migration,
        )


@dataclass(frozen=True, slots=True)
class GroupDeployment:
    """How one group is served: `workers` of `deployment.tp` devices each. `model_tp` is
    the degree the model alone would need; above it, the knobs forced a larger one."""

    group: str
    devices: int
    workers: int
    deployment: Deployment
    model_tp: int

    @property
    def note(self) -> str:
        """Why the degree is what it is, when the knobs, not the model, set it."""
        if self.deployment.tp <= self.model_tp:
            return ""
        return (
            f"tensor-parallel {self.deployment.tp}, not {self.model_tp}: one device holds "
            "the model but not max_model_len + h_min + delta tokens of KV"
        )

    def summary(self) -> dict[str, Any]:
        d = self.deployment
        return {
            "accelerator": d.accelerator.name,
            "devices": self.devices,
            "tensor_parallel": d.tp,
            "workers": self.workers,
            "kv_capacity_tokens": d.kv_capacity_tokens,
            "note": self.note,
        }


class Scenario(Strict):
    name: str = Field(min_length=1, max_length=253)
    model: str
    max_model_len: int = Field(ge=1, le=MAX_TOKENS)
    groups: list[Group] = Field(min_length=1, max_length=64)
    physics: Physics = Physics()
    workload: Workload = Workload()
    trainer: TrainerSettings = TrainerSettings()
    scheduling: Scheduling = Scheduling()
    autoscaling: Autoscaling | None = None  # unset: the pool keeps its size
    seed: int = Field(default=0, ge=0, le=2**63)
    _deployments: tuple[GroupDeployment, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}: use one of {', '.join(MODELS)}")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError("group names must be unique")
        if self.workload.prompt_tokens >= self.max_model_len:
            raise ValueError("prompt_tokens must be below max_model_len")
        self._deployments = tuple(self._deploy(g) for g in self.groups)
        if self.autoscaling is not None:
            cost = sum(
                d.deployment.accelerator.price_per_hour.value * d.deployment.tp * d.workers
                for d in self._deployments
                if d.deployment.accelerator.price_per_hour is not None
            )
            if cost > self.autoscaling.budget_per_hour * (1 + 1e-9):  # sums of prices round
                raise ValueError(
                    f"autoscaling.budget_per_hour {self.autoscaling.budget_per_hour:g} is below "
                    f"the pool's starting cost of {cost:.4g} an hour"
                )
        return self

    def _deploy(self, group: Group) -> GroupDeployment:
        """A group's workers, or a ValueError that names it: devices too few for one
        worker, or a model and KV that fit no tensor-parallel degree."""
        model, acc, phys = MODELS[self.model], group.resolve(), self.physics
        efficiency = phys.efficiency(group.efficiency)

        def sized(kv_tokens: int) -> Deployment:
            return deploy(
                model,
                acc,
                kv_tokens,
                efficiency=efficiency,
                memory_utilisation=phys.memory_utilisation,
                reserve_bytes=phys.reserve_gb * 1e9,
            )

        need = self.min_kv_tokens()
        if group.kv_tokens is not None and group.tensor_parallel is not None:
            tp = group.tensor_parallel
            if group.kv_tokens < need:
                raise ValueError(
                    f"group {group.name}: {group.kv_tokens:,} tokens of KV per worker are "
                    f"fewer than the {need:,} no stranding needs"
                )
            if group.devices < tp:
                raise ValueError(
                    f"group {group.name}: {group.devices} x {acc.name} make no worker of "
                    f"tensor-parallel {tp}"
                )
            pinned = Deployment(model, acc, tp, group.kv_tokens, efficiency)
            return GroupDeployment(group.name, group.devices, group.devices // tp, pinned, tp)
        try:
            d = sized(need)
        except ValueError:
            s = self.scheduling
            raise ValueError(
                f"group {group.name}: {model.name} with {need:,} tokens of KV per worker "
                f"(max_model_len {self.max_model_len:,} + h_min {s.h_min_tokens:,} + delta "
                f"{s.delta_tokens:,}) fits on no tensor-parallel degree up to 8 x {acc.name}"
            ) from None
        if group.devices < d.tp:
            raise ValueError(
                f"group {group.name}: {group.devices} x {acc.name} make no worker: "
                f"{model.name} with {need:,} tokens of KV needs tensor-parallel {d.tp}"
            )
        try:
            model_tp = sized(min(need, self.max_model_len)).tp
        except ValueError:
            model_tp = d.tp
        return GroupDeployment(group.name, group.devices, group.devices // d.tp, d, model_tp)

    def deployments(self) -> tuple[GroupDeployment, ...]:
        """Each group's workers, in the order of `groups`."""
        return self._deployments

    def length_model(self) -> LengthLaw:
        w = self.workload
        if w.response_lengths is not None:
            return w.response_lengths.build()
        return LengthModel(w.median_response_tokens, w.sigma_between_groups, w.sigma_within_group)

    def multi_turn(self) -> MultiTurn:
        w = self.workload
        latency = w.env_latency.build() if w.env_latency else Exponential(w.env_latency_s)
        return MultiTurn(w.multi_turn_share, w.max_tool_calls, latency, w.observation_tokens)

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
                max_model_len=self.max_model_len,
                multi_turn=turns,
                scale=(1.0 + w.response_growth) ** (group // w.prompts_per_batch),
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

    def floor_warnings(self) -> list[str]:
        """A sentence per group on which a pinned `h_min` is below one control period's
        growth at the engine's batch limit (none under auto)."""
        s = self.scheduling
        if s.h_min == "auto":
            return []
        out = []
        for g in self.deployments():
            d = g.deployment
            cap, period = d.kv_capacity_tokens, s.control_period_s
            said = floor_warning(
                f"group {g.group}",
                s.h_min,
                step_cost(d),
                self.physics.max_batch,
                capacity=cap,
                period_s=period,
            )
            if said is not None:
                out.append(said)
        return out

    def min_kv_tokens(self) -> int:
        s = self.scheduling
        needed = self.max_model_len + s.h_min_tokens + s.delta_tokens
        return self.physics.min_kv_tokens or needed

    @staticmethod
    def load(path: Path) -> Scenario:
        """Read and validate a scenario YAML file (errors: OSError, UnicodeDecodeError,
        yaml.YAMLError, pydantic.ValidationError); files it names are read relative to it."""
        raw = yaml.safe_load(read_input(path).decode("utf-8"))
        return Scenario.model_validate(raw, context={"base": path.parent})
