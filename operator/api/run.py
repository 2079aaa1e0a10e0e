"""`TrainingRun`: a model, a dataset, a trainer, the batch and the scheduler's knobs,
bound to a RolloutPool by name."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from cadence.common.catalog import MODELS
from cadence.common.limits import (
    MAX_ETA,
    MAX_ITERATIONS,
    MAX_PROMPTS_PER_BATCH,
    MAX_SAMPLES_PER_PROMPT,
)
from cadence.operator.api.base import (
    DNS_LABEL,
    MAX_LENGTH,
    RUN_NAME_MAX,
    LabelValue,
    Metadata,
    Quantity,
    Spec,
    cel_kept,
    cel_rule,
    cel_same,
    check_name,
    label_keys,
)
from cadence.operator.api.pool import PodOverlay, Toleration
from cadence.operator.api.status import TrainingRunStatus
from cadence.scheduler.registry import POLICIES
from cadence.sim.laws import (
    EmpiricalLengthsSpec,
    LengthLawSpec,
    LognormalLengths,
    MixtureComponent,
    MixtureLengthsSpec,
)
from cadence.sim.scenario import AutoOrTokens
from cadence.worker.api import greedy_or_above_the_floor

MODEL_URI = r"^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^/]+)*/?$"


class ModelRef(Spec):
    """The policy model's weights (a Hugging Face directory) and the catalog model whose
    roofline and KV an emulated pool follows. `uri` is where a cluster gets them:
    `pvc://CLAIM/PATH` mounts the claim read-only at /models in every worker and the
    trainer, and the model is /models/PATH. `path` is the directory as the processes see
    it: without `uri`, one in the image or on a volume the group's pod template mounts
    (default /models/CATALOG); under `cadence run`, a local directory (default: a tiny
    model made on the spot)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel_rule(
                    "!(has(self.uri) && has(self.path))",
                    "give model.uri (a claim to mount) or model.path, not both",
                )
            ]
        }
    )

    path: str | None = None
    """The model's directory as the workers and the trainer see it: in the image or on a
    volume the pod templates mount (default /models/CATALOG); under `cadence run`, a
    local directory (default: a tiny model made on the spot); not with uri."""
    uri: str | None = Field(default=None, pattern=MODEL_URI)
    """pvc://CLAIM/PATH: the PersistentVolumeClaim CLAIM, in the run's namespace, mounted
    read-only at /models in every worker and the trainer, the model being /models/PATH;
    not with path."""
    catalog: str = Field(default="Qwen3-8B", json_schema_extra={"enum": list(MODELS)})
    """The catalog model the weights are (its size and KV per token): the pool's capacity
    check, the scheduler's step costs and emulated workers follow it."""

    @model_validator(mode="after")
    def _known(self) -> Self:
        if self.catalog not in MODELS:
            raise ValueError(
                f"unknown catalog model {self.catalog!r}: use one of {', '.join(MODELS)}"
            )
        if self.uri is not None and self.path is not None:
            raise ValueError("give model.uri (a claim to mount) or model.path, not both")
        return self

    def claim(self) -> tuple[str, str] | None:
        """(claim, path inside it) of a `pvc://` uri."""
        if self.uri is None:
            return None
        claim, _, inside = self.uri.removeprefix("pvc://").partition("/")
        return claim, inside.strip("/")

    def in_pod(self, mount: str) -> str:
        """The model's directory inside a worker's or the trainer's container."""
        claim = self.claim()
        if claim is not None:
            return f"{mount}/{claim[1]}".rstrip("/")
        return self.path or f"{mount}/{self.catalog}"


class Dataset(Spec):
    """Where prompts come from: a built-in task (prompts and verifier in the trainer), or
    `external`, whose prompts and rewards an external trainer posts to the trainer's API."""

    task: Literal["digits", "arithmetic", "external"] = "digits"
    """digits or arithmetic: prompts and a verifier built into the trainer; external: an
    external trainer submits the prompts and trains each batch through the trainer's
    API."""


class TrainerSpec(Spec):
    """The trainer's pod: its image, devices and where it may run; and the update rule.
    `keepState` keeps the ledger and weights' volume after the run is deleted."""

    image: str | None = None
    """The trainer's container image; unset: the pool's image."""
    resources: dict[str, Quantity] = {}
    """What the trainer's pod requests, as Kubernetes quantities (nvidia.com/gpu: 1);
    devices are limits too, and cpu and memory default to 2 and 8Gi."""
    node_selector: dict[str, LabelValue] = Field(default={}, max_length=64)
    """Node labels the trainer pod's node must have (the pod's nodeSelector)."""
    tolerations: list[Toleration] = []
    """Node taints the trainer pod tolerates."""
    template: PodOverlay = PodOverlay()
    """What a platform adds to the trainer's pod (placement, identity, extra env,
    volumes and mounts)."""
    storage: Quantity = "20Gi"
    """The size of the trainer's PersistentVolumeClaim, which holds the ledger, the
    published weights and the optimizer's state (a quantity such as 20Gi)."""
    keep_state: bool = False
    """Keep the trainer's volume when the run is deleted; false: it goes with the run."""
    learning_rate: float = Field(default=2e-2, ge=0)
    """AdamW's learning rate for each policy update."""
    advantages: Literal["group", "batch"] = "group"
    """group (GRPO): a sample's reward minus its group's mean, over the group's standard
    deviation; batch: its reward minus the batch's mean."""
    clip_eps: float = Field(default=0.2, gt=0)
    """PPO-clip's epsilon: the importance ratio is clipped to [1 - clipEps, 1 + clipEps]."""
    epochs: int = Field(default=1, ge=1)
    """Passes over each batch in one policy update."""

    _keys = field_validator("node_selector")(label_keys)


AUTO_OR_TOKENS: JsonDict = {
    "x-kubernetes-validations": [
        {
            "rule": "type(self) == string ? self == 'auto' : self >= 0",
            "message": "must be auto or a number of tokens >= 0",
        }
    ]
}
# What sizes the pool (every worker holds the longest trajectory plus these) and what a
# worker whose step cost is unknown gets, when hMin or delta is auto.
SIZING_H_MIN = 256
SIZING_DELTA = 16


class SchedulerSpec(Spec):
    """`hMin` and `delta` are `auto` or pinned tokens. Auto: each worker's floor and
    reserve are derived every cycle from its step cost and the control period, never
    below 256 and 16 tokens, which also size the pool's workers."""

    policy: str = Field(default="cadence", json_schema_extra={"enum": list(POLICIES)})
    """The control loop's policy: cadence, or a baseline to compare it with (sync,
    one-off, areal, laminar, dora, laminar-native)."""
    eta: int = Field(default=1, ge=0, le=MAX_ETA)
    """The staleness bound, in policy versions: a sample of batch u starts only on a
    version of at least u - eta, and admission runs at most eta + 1 batches ahead of the
    newest version; 0 is synchronous, on-policy training."""
    delta: AutoOrTokens = Field(default="auto", json_schema_extra=AUTO_OR_TOKENS)
    """The decode reserve per resident, in tokens (a placement must leave the floor plus
    delta for each resident free); auto: one control period's growth at the worker's
    step rate, at least 16."""
    h_min: AutoOrTokens = Field(default="auto", json_schema_extra=AUTO_OR_TOKENS)
    """The headroom floor, in tokens (a worker with less free KV evicts its longest
    resident); auto: one control period's growth of all its residents at the worker's
    step rate, at least 256."""
    control_period_s: float = Field(default=0.5, gt=0)
    """Seconds between control cycles, each observing every worker and applying one
    plan."""
    min_decode: int = Field(default=4, ge=1)
    """The anti-thrash minimum: a trajectory is not evicted before it has decoded this
    many tokens where it was placed."""
    concentrate_without_fresh: bool = False
    """Start concentration even when no newer version has fresh work for the emptied
    source (the Cadence policy's experiment switch, off by default)."""
    migration: Literal["auto", "kv", "reprefill"] = "auto"
    """How a departed trajectory moves between workers: auto pulls its KV cache where the
    two workers' KV layouts match (same model, dtype, block size, parallel layout and
    accelerator type) and re-prefills it otherwise; kv moves it only to a worker that can
    pull its KV; reprefill always recomputes it on the destination."""

    @model_validator(mode="after")
    def _known(self) -> Self:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}: use one of {', '.join(POLICIES)}")
        return self


class LengthComponent(Spec):
    """One lognormal component of a mixture law, with its share of the samples."""

    weight: float = Field(gt=0, le=1e6)
    """Its share of the samples, relative to the other components' weights."""
    median_tokens: float = Field(gt=0, le=MAX_LENGTH)
    """Its median response length, in tokens."""
    sigma_between_groups: float = Field(default=0.5, ge=0, le=5)
    """The spread of a group's log-median (a hard prompt makes every sample long)."""
    sigma_within_group: float = Field(default=0.5, ge=0, le=5)
    """The spread of one sample's log-length around its group's."""


class ResponseLengths(Spec):
    """How long each sample's response is, drawn from a law: the simulator's laws, so one
    file describes the same workload to `cadence run` and `cadence sim`. Each sample's
    drawn length (capped at `maxTokens`) becomes its token budget, and the workers decode
    to it whatever the model samples (vLLM's ignore_eos), so a real run is as long-tailed
    as the law; the reward still scores what the model wrote."""

    law: Literal["lognormal", "mixture", "empirical"]
    """lognormal (medianTokens and the two sigmas), mixture (components) or empirical
    (recorded lengths replayed, with groupCorrelation)."""
    median_tokens: float | None = Field(default=None, gt=0, le=MAX_LENGTH)
    """lognormal: the median response length, in tokens."""
    sigma_between_groups: float = Field(default=0.75, ge=0, le=5)
    """lognormal: the spread of a group's log-median."""
    sigma_within_group: float = Field(default=0.6, ge=0, le=5)
    """lognormal: the spread of one sample's log-length around its group's."""
    components: list[LengthComponent] = Field(default=[], max_length=64)
    """mixture: its lognormal components."""
    lengths: list[Annotated[int, Field(ge=1, le=MAX_LENGTH)]] = Field(
        default=[], max_length=100_000
    )
    """empirical: recorded response lengths, in tokens."""
    group_correlation: float = Field(default=0.6, ge=0, le=1)
    """empirical: how alike the lengths of one group's samples are (0: independent)."""
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    """The draw's seed: the same seed draws the same lengths for every group."""

    def spec(self) -> LengthLawSpec:
        """The same law as the simulator's scenario spells it."""
        if self.law == "lognormal":
            assert self.median_tokens is not None
            return LognormalLengths(
                law="lognormal",
                median_tokens=self.median_tokens,
                sigma_between_groups=self.sigma_between_groups,
                sigma_within_group=self.sigma_within_group,
            )
        if self.law == "mixture":
            return MixtureLengthsSpec(
                law="mixture",
                components=[
                    MixtureComponent(
                        weight=c.weight,
                        median_tokens=c.median_tokens,
                        sigma_between_groups=c.sigma_between_groups,
                        sigma_within_group=c.sigma_within_group,
                    )
                    for c in self.components
                ],
            )
        return EmpiricalLengthsSpec(
            law="empirical",
            values=[float(n) for n in self.lengths],
            group_correlation=self.group_correlation,
        )

    @model_validator(mode="after")
    def _one_law(self) -> Self:
        need = {"lognormal": "medianTokens", "mixture": "components", "empirical": "lengths"}
        given = {
            "lognormal": self.median_tokens is not None,
            "mixture": bool(self.components),
            "empirical": bool(self.lengths),
        }
        if not given[self.law]:
            raise ValueError(f"the {self.law} law needs {need[self.law]}")
        others = [need[law] for law, g in given.items() if g and law != self.law]
        if others:
            raise ValueError(f"the {self.law} law takes no {', '.join(others)}")
        return self


class BatchSpec(Spec):
    """The shape of a training batch and how its samples are drawn (the trainer's)."""

    prompts_per_batch: int = Field(default=8, ge=1, le=MAX_PROMPTS_PER_BATCH)
    """B: prompts per training batch, each one a group of samples."""
    samples_per_prompt: int = Field(default=8, ge=2, le=MAX_SAMPLES_PER_PROMPT)
    """Samples drawn per prompt: the group whose rewards GRPO's advantages compare."""
    max_tokens: int = Field(default=12, ge=1, le=MAX_LENGTH)
    """The most tokens a sample's response may have."""
    response_lengths: ResponseLengths | None = None
    """Each sample's response length drawn from a law (capped at maxTokens) and decoded
    to whatever the model samples; unset: the model decides, up to maxTokens."""
    iterations: int = Field(default=12, ge=1, le=MAX_ITERATIONS)
    """Batches to train, each publishing the next policy version; the run succeeds after
    the last."""
    temperature: float = Field(default=1.0, ge=0)
    """The workers' sampling temperature (0: greedy, else at least 0.01, vLLM's floor),
    which the trainer scores at too."""

    _floor = field_validator("temperature")(greedy_or_above_the_floor)


class MultiTurnSpec(Spec):
    """Tool calls: a sample that calls a tool leaves its worker while the environment
    answers, and continues wherever the scheduler places it."""

    environment: str | None = None
    """What answers tool calls: a URL the workers call, or calculator for the reference
    environment (`cadence run` starts it as a process; the operator runs it beside the
    trainer, in the trainer's pod and Service); unset: single-turn."""
    max_tool_calls: int = Field(default=0, ge=0)
    """The most tool calls one sample makes (later ones stay text); 0: none."""
    timeout_s: float = Field(default=30.0, gt=0)
    """Seconds a worker waits for the environment on each try."""
    tries: int = Field(default=3, ge=1)
    """Tries per tool call; a call that fails them all ends its sample as failed."""


# What cannot change on a live run: the pool it bound, and what its trainer reads once,
# from the ConfigMap made when the run binds its pool (never updated), and its ledger
# records (the model, the dataset's cursor).
RUN_FIXED = ("pool", "model", "dataset", "trainer", "batch")


def _run_fixed(field: str) -> str:
    return f"spec.{field} cannot change once the run exists; make a new TrainingRun"


class CompletionSpec(Spec):
    """What happens when the run has trained its last batch, as Kubeflow's trainers'
    run policies do: the workers are released as soon as it finishes."""

    stop_trainer: bool = True
    """Stop the trainer's pod (its StatefulSet to 0 replicas): it may hold many devices.
    Its state (ledger, weights) and Service stay; false keeps it serving."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=10**8)
    """Delete the TrainingRun (and so its trainer, state and all) this long after it
    finished; unset: keep it until deleted by hand."""


class TraceSpec(Spec):
    """The run's trace: every delivered trajectory's sizes and tool latencies, each
    worker's measured decode steps and every action of the control loop, as JSON Lines
    for `cadence sim --trace` to replay. The operator writes it under its `--trace-dir`
    (a volume of its pod), as `<namespace>/<name>-<uid>.jsonl`."""

    enabled: bool = True
    """false: no trace (an operator started without `--trace-dir` writes none either)."""


class TrainingRunSpec(Spec):
    """What a run trains (model, dataset, batch, trainer), on which pool, and how its
    control loop schedules; only scheduler and multiTurn may change once it exists."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *(cel_kept(f, _run_fixed(f)) for f in RUN_FIXED if f != "pool"),
                # The trainer admits by eta too (its ConfigMap, made once): the loop and
                # the trainer must not hold two bounds. 1 is the default when absent.
                cel_rule(
                    "(has(self.scheduler) ? self.scheduler.eta : 1)"
                    " == (has(oldSelf.scheduler) ? oldSelf.scheduler.eta : 1)",
                    _run_fixed("scheduler.eta"),
                ),
            ]
        }
    )

    model: ModelRef = ModelRef()
    """The policy model: where its weights are and the catalog model it is; fixed once
    the run exists."""
    pool: str = Field(
        pattern=DNS_LABEL,
        json_schema_extra={"x-kubernetes-validations": [cel_same(_run_fixed("pool"))]},
    )
    """The RolloutPool, in the run's namespace, whose workers serve the run (one run at
    a time); fixed once the run exists."""
    dataset: Dataset = Dataset()
    """Where prompts and rewards come from; fixed once the run exists (the ledger
    records how far admission has read it)."""
    trainer: TrainerSpec = TrainerSpec()
    """The trainer's pod and update rule, read once when the run binds its pool; fixed
    once the run exists."""
    scheduler: SchedulerSpec = SchedulerSpec()
    """The control loop's policy and knobs (staleness bound, floor, reserve, period);
    a change restarts the run's control loop with them, but for eta, which the trainer
    admits by too and is fixed once the run exists."""
    batch: BatchSpec = BatchSpec()
    """Batch shape, length and sampling, read by the trainer once when the run binds its
    pool; fixed once the run exists."""
    multi_turn: MultiTurnSpec = MultiTurnSpec()
    """Tool calls: the environment and its limits; off unless environment and
    maxToolCalls are set."""
    completion: CompletionSpec = CompletionSpec()
    """What happens once the run finished: its trainer stopped, the run deleted after a
    while."""
    trace: TraceSpec = TraceSpec()
    """Whether the control loop records the run's trace."""


class TrainingRun(Spec):
    api_version: Literal["cadence.dev/v1alpha1"]
    kind: Literal["TrainingRun"]
    metadata: Metadata
    spec: TrainingRunSpec
    status: TrainingRunStatus | None = None

    @model_validator(mode="after")
    def _names(self) -> Self:
        check_name(self.metadata.name, RUN_NAME_MAX, "run")
        return self


# --- status, written by the operator -------------------------------------------------------
