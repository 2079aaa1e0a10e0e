"""The custom resources, once: `RolloutPool` and `TrainingRun` (group `cadence.dev`,
version `v1alpha1`) as pydantic models. `cadence run` validates a YAML file with them,
and the operator will serve them as CRDs generated from them, so one model validates
both paths.

Field names are Kubernetes' camelCase in YAML (`pricePerHour`, `minReplicas`) and
snake_case in Python. Rules within one resource are checked here (replica bounds,
unique group names, a known accelerator or custom figures); rules across resources or
needing the catalog (a trajectory of `maxModelLen` must fit every group under
`hMin + delta`) are checked where both are known (`check_pair`). A bad file is one
sentence naming the field path (`ResourceError`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from cadence.operator.scheduler.registry import POLICIES
from cadence.sim.catalog import ACCELERATORS, MODELS

GROUP = "cadence.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class ResourceError(ValueError):
    """A resource that does not validate; the message is one sentence."""


class _Spec(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class CustomAccelerator(_Spec):
    """An accelerator type the catalog lacks: its figures (estimates)."""

    memory_gb: float = Field(gt=0)
    bandwidth_tb_s: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0)


class EngineSettings(_Spec):
    tensor_parallel: int | None = Field(default=None, ge=1)  # None: the smallest that fits
    max_model_len: int = Field(default=4096, ge=16)
    memory_utilization: float = Field(default=0.9, gt=0, le=1)
    kv_transfer: bool = False  # vLLM KV connectors between workers of one vendor


class Toleration(_Spec):
    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class PoolGroup(_Spec):
    """Workers of one accelerator type. `replicas` is the initial count; afterwards the
    group's own resource owns it (an autoscaler may drive it within min/max)."""

    name: str = Field(pattern=DNS_LABEL)
    accelerator: str = Field(min_length=1)
    custom: CustomAccelerator | None = None
    affinity: int = Field(default=0, ge=0)
    replicas: int = Field(default=1, ge=0)
    min_replicas: int = Field(default=0, ge=0)
    max_replicas: int = Field(default=64, ge=0)
    resources: dict[str, str] = {}
    node_selector: dict[str, str] = {}
    tolerations: list[Toleration] = []
    price_per_hour: float | None = Field(default=None, ge=0)
    engine: EngineSettings = EngineSettings()

    @model_validator(mode="after")
    def _rules(self) -> Self:
        if self.custom is None and self.accelerator not in ACCELERATORS:
            known = ", ".join(sorted(ACCELERATORS))
            raise ValueError(
                f"unknown accelerator {self.accelerator!r}: use one of {known}, "
                "or give its figures under 'custom'"
            )
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError(
                f"minReplicas <= replicas <= maxReplicas does not hold "
                f"({self.min_replicas}, {self.replicas}, {self.max_replicas})"
            )
        return self


class RolloutPoolSpec(_Spec):
    groups: list[PoolGroup] = Field(min_length=1)
    image: str = "cadence:latest"
    token_secret: str = Field(default="cadence-token", pattern=DNS_LABEL)

    @model_validator(mode="after")
    def _unique(self) -> Self:
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError("group names must be unique")
        return self


class Metadata(_Spec):
    model_config = ConfigDict(extra="allow", frozen=True)  # labels, annotations, uid, ...

    name: str = Field(pattern=DNS_LABEL)
    namespace: str = "default"


class RolloutPool(_Spec):
    api_version: Literal["cadence.dev/v1alpha1"]
    kind: Literal["RolloutPool"]
    metadata: Metadata
    spec: RolloutPoolSpec


class ModelRef(_Spec):
    """The policy model: a local path (tiny test models) or a URI, and the catalog model
    whose roofline and KV an emulated pool follows."""

    path: str | None = None
    uri: str | None = None
    catalog: str = "Qwen3-8B"

    @model_validator(mode="after")
    def _known(self) -> Self:
        if self.catalog not in MODELS:
            raise ValueError(
                f"unknown catalog model {self.catalog!r}: use one of {', '.join(MODELS)}"
            )
        return self


class Dataset(_Spec):
    task: Literal["digits", "arithmetic", "external"] = "digits"
    path: str | None = None  # a prompt file on a volume (external tasks)


class TrainerSpec(_Spec):
    image: str | None = None
    resources: dict[str, str] = {}
    learning_rate: float = Field(default=2e-2, ge=0)
    advantages: Literal["group", "batch"] = "group"
    clip_eps: float = Field(default=0.2, gt=0)
    epochs: int = Field(default=1, ge=1)


class SchedulerSpec(_Spec):
    policy: str = "cadence"
    eta: int = Field(default=1, ge=0)
    delta: int = Field(default=16, ge=0)
    h_min: int = Field(default=256, ge=0)
    control_period_s: float = Field(default=0.5, gt=0)
    min_decode: int = Field(default=4, ge=1)  # anti-thrash minimum

    @model_validator(mode="after")
    def _known(self) -> Self:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}: use one of {', '.join(POLICIES)}")
        return self


class BatchSpec(_Spec):
    prompts_per_batch: int = Field(default=8, ge=1)  # B
    samples_per_prompt: int = Field(default=8, ge=2)
    max_tokens: int = Field(default=12, ge=1)
    iterations: int = Field(default=12, ge=1)
    temperature: float = Field(default=1.0, ge=0)


class MultiTurnSpec(_Spec):
    environment: str | None = None  # a URL, or "calculator" for the reference environment
    max_tool_calls: int = Field(default=0, ge=0)
    timeout_s: float = Field(default=30.0, gt=0)
    tries: int = Field(default=3, ge=1)


class TrainingRunSpec(_Spec):
    model: ModelRef = ModelRef()
    pool: str = Field(pattern=DNS_LABEL)
    dataset: Dataset = Dataset()
    trainer: TrainerSpec = TrainerSpec()
    scheduler: SchedulerSpec = SchedulerSpec()
    batch: BatchSpec = BatchSpec()
    multi_turn: MultiTurnSpec = MultiTurnSpec()


class TrainingRun(_Spec):
    api_version: Literal["cadence.dev/v1alpha1"]
    kind: Literal["TrainingRun"]
    metadata: Metadata
    spec: TrainingRunSpec


def check_pair(pool: RolloutPool, run: TrainingRun) -> None:
    """Rules across the two resources."""
    if run.spec.pool != pool.metadata.name:
        raise ResourceError(
            f"TrainingRun spec.pool: it names pool {run.spec.pool!r}, "
            f"but the pool here is {pool.metadata.name!r}"
        )


def _where(e: ValidationError, kind: str) -> str:
    first = e.errors()[0]
    path = ".".join(str(p) for p in first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    return f"{kind} {path}: {message}" if path else f"{kind}: {message}"


def load(path: Path) -> tuple[RolloutPool, TrainingRun]:
    """A YAML file holding one RolloutPool and one TrainingRun (any order)."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except OSError as e:
        raise ResourceError(f"cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ResourceError(f"{path} is not YAML: {str(e).splitlines()[0]}") from None
    found: dict[str, Any] = {}
    for d in documents:
        kind = d.get("kind") if isinstance(d, dict) else None
        if kind not in ("RolloutPool", "TrainingRun"):
            raise ResourceError(
                f"{path}: a document of kind {kind!r}; expected RolloutPool or TrainingRun"
            )
        if kind in found:
            raise ResourceError(f"{path} holds more than one {kind}")
        model = RolloutPool if kind == "RolloutPool" else TrainingRun
        try:
            found[kind] = model.model_validate(d)
        except ValidationError as e:
            raise ResourceError(_where(e, kind)) from None
    for kind in ("RolloutPool", "TrainingRun"):
        if kind not in found:
            raise ResourceError(f"{path} holds no {kind}")
    pool, run = found["RolloutPool"], found["TrainingRun"]
    check_pair(pool, run)
    return pool, run
