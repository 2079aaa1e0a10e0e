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

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from cadence.common.catalog import ACCELERATORS, MODELS
from cadence.operator.scheduler.registry import POLICIES
from cadence.sim.scenario import AutoOrTokens

GROUP = "cadence.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Pools and runs name what the operator makes for them, so their names must leave every
# derived name valid: a DNS-1035 label (a Service's name starts with a letter), and short
# enough for "{pool}-workers" (a Service), "{pool}-{group}-{index}" (a pod's hostname,
# index up to 5 digits) and "{run}-trainer" (a StatefulSet, whose revision-hash label
# caps its name at 52).
DNS_1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
POOL_NAME_MAX = 63 - len("-workers")
POOL_AND_GROUP_MAX = 63 - len("--99999")
RUN_NAME_MAX = 52 - len("-trainer")
MAX_REPLICAS = 99_999


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


# Kubernetes' own patterns: a resource quantity (`1`, `500m`, `16Gi`) and a label's key
# and value, so a bad device count or node selector is refused where it is written.
QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"


def _quantity(value: object) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r} is not a quantity (a number, or a string like 500m or 16Gi)")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative; a quantity is at least 0")
        return value
    if not re.fullmatch(QUANTITY, value):
        raise ValueError(f"{value!r} is not a quantity (a number, or a string like 500m or 16Gi)")
    return value


# A device or memory request as Kubernetes writes it: `nvidia.com/gpu: 1` or `"16Gi"`.
Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema(
        {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}], "pattern": QUANTITY}
    ),
]
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE, max_length=63)]


def _label_keys(selector: dict[str, str]) -> dict[str, str]:
    for key in selector:
        if not re.fullmatch(LABEL_KEY, key) or len(key.rpartition("/")[2]) > 63:
            raise ValueError(f"node selector key {key!r} is not a label key")
    return selector


def _rule(rule: str, message: str) -> JsonDict:
    """A CEL rule the generated CRD carries (x-kubernetes-validations); the pydantic
    validator next to it checks the same, so both paths refuse the same objects."""
    return {"rule": rule, "message": message}


_KNOWN_ACCELERATOR = _rule(
    "has(self.custom) || self.accelerator in ["
    + ", ".join(f"'{a}'" for a in sorted(ACCELERATORS))
    + "]",
    "accelerator must be a catalog type, or give its figures under custom",
)
_REPLICA_BOUNDS = _rule(
    "self.minReplicas <= self.replicas && self.replicas <= self.maxReplicas",
    "minReplicas <= replicas <= maxReplicas must hold",
)


# What the operator's own pods use; an overlay may not take these names.
RESERVED_VOLUMES = frozenset({"shm", "models", "state", "config"})
RESERVED_ENV = frozenset({"CADENCE_TOKEN"})


class PodOverlay(_Spec):
    """What a platform adds to the pods the operator makes, as KubeRay's and
    LeaderWorkerSet's pod templates let it: placement (affinity, topology spread,
    priority, a gang scheduler's name), identity (service account, pull secrets,
    runtime class), and extra env, volumes and mounts for the main container. Merged over
    what the operator sets: its labels, selectors, arguments, ports and probes stay its
    own; the Kubernetes objects inside (affinity, a volume) are checked by the API server
    when the pod is made, and a refusal is the group's `Degraded` condition."""

    labels: dict[str, LabelValue] = Field(default={}, max_length=64)
    annotations: dict[str, str] = Field(default={}, max_length=64)
    affinity: dict[str, Any] | None = Field(default=None)
    topology_spread_constraints: list[dict[str, Any]] = Field(default=[], max_length=16)
    priority_class_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN)
    scheduler_name: str | None = Field(default=None, min_length=1)
    service_account_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN)
    automount_service_account_token: bool | None = None
    runtime_class_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN)
    image_pull_secrets: list[str] = Field(default=[], max_length=16)
    env: list[dict[str, Any]] = Field(default=[], max_length=64)
    volumes: list[dict[str, Any]] = Field(default=[], max_length=32)
    volume_mounts: list[dict[str, Any]] = Field(default=[], max_length=32)

    _keys = field_validator("labels")(_label_keys)

    @model_validator(mode="after")
    def _own_names(self) -> Self:
        for kind, items, reserved in (
            ("volume", self.volumes, RESERVED_VOLUMES),
            ("env", self.env, RESERVED_ENV),
        ):
            for item in items:
                name = item.get("name")
                if not isinstance(name, str) or not name:
                    raise ValueError(f"every {kind} of the pod template needs a name")
                if name in reserved:
                    raise ValueError(f"{kind} name {name!r} is the operator's own")
        for mount in self.volume_mounts:
            if not isinstance(mount.get("name"), str) or "mountPath" not in mount:
                raise ValueError("every volume mount needs a name and a mountPath")
        return self


class GroupSettings(_Spec):
    """What a group of workers of one accelerator type runs with (a pool's group and a
    RolloutGroup share it)."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [_KNOWN_ACCELERATOR, _REPLICA_BOUNDS]}
    )

    accelerator: str = Field(min_length=1)
    custom: CustomAccelerator | None = None
    affinity: int = Field(default=0, ge=0)
    replicas: int = Field(default=1, ge=0)
    min_replicas: int = Field(default=0, ge=0)
    max_replicas: int = Field(default=64, ge=0, le=MAX_REPLICAS)
    resources: dict[str, Quantity] = {}
    # Keys are checked by the model, not by CEL: a rule over a map's keys, whose length
    # no schema bounds, can exceed the API server's cost budget for a CRD.
    node_selector: dict[str, LabelValue] = Field(default={}, max_length=64)
    tolerations: list[Toleration] = []
    price_per_hour: float | None = Field(default=None, ge=0)
    engine: EngineSettings = EngineSettings()
    template: PodOverlay = PodOverlay()

    _keys = field_validator("node_selector")(_label_keys)

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


class PoolGroup(GroupSettings):
    """Workers of one accelerator type. `replicas` is the initial count; afterwards the
    group's own resource (`RolloutGroup`) owns it, so an autoscaler may drive it."""

    name: str = Field(pattern=DNS_LABEL, max_length=63)


class RolloutPoolSpec(_Spec):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    "self.groups.all(g, self.groups.exists_one(h, h.name == g.name))",
                    "group names must be unique",
                )
            ]
        }
    )

    groups: list[PoolGroup] = Field(min_length=1, max_length=32)
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


POOL_NAME_RULES = (
    _rule(
        f"self.metadata.name.matches('{DNS_1035}') && size(self.metadata.name) <= {POOL_NAME_MAX}",
        f"a pool's name starts with a letter and has at most {POOL_NAME_MAX} characters "
        "(its workers' Service is named after it)",
    ),
    _rule(
        f"self.spec.groups.all(g, size(self.metadata.name) + size(g.name) <= {POOL_AND_GROUP_MAX})",
        f"a pool's name and each group's name have at most {POOL_AND_GROUP_MAX} characters "
        "together (its worker pods are named pool-group-index)",
    ),
)
RUN_NAME_RULES = (
    _rule(
        f"self.metadata.name.matches('{DNS_1035}') && size(self.metadata.name) <= {RUN_NAME_MAX}",
        f"a run's name starts with a letter and has at most {RUN_NAME_MAX} characters "
        "(its trainer's StatefulSet and Service are named after it)",
    ),
)


def _check_name(name: str, longest: int, what: str) -> None:
    if not re.fullmatch(DNS_1035, name) or len(name) > longest:
        raise ValueError(
            f"metadata.name {name!r}: a {what}'s name starts with a letter, holds only a-z, "
            f"0-9 and '-', and has at most {longest} characters"
        )


class RolloutPool(_Spec):
    api_version: Literal["cadence.dev/v1alpha1"]
    kind: Literal["RolloutPool"]
    metadata: Metadata
    spec: RolloutPoolSpec
    status: RolloutPoolStatus | None = None

    @model_validator(mode="after")
    def _names(self) -> Self:
        name = self.metadata.name
        _check_name(name, POOL_NAME_MAX, "pool")
        for g in self.spec.groups:
            if len(name) + len(g.name) > POOL_AND_GROUP_MAX:
                raise ValueError(
                    f"pool {name!r} and group {g.name!r} have {len(name) + len(g.name)} "
                    f"characters together; at most {POOL_AND_GROUP_MAX} (worker pods are "
                    "named pool-group-index)"
                )
        return self


# `pvc://CLAIM` or `pvc://CLAIM/PATH`: a PersistentVolumeClaim in the run's namespace.
MODEL_URI = r"^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^/]+)*/?$"


class ModelRef(_Spec):
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
                _rule(
                    "!(has(self.uri) && has(self.path))",
                    "give model.uri (a claim to mount) or model.path, not both",
                )
            ]
        }
    )

    path: str | None = None
    uri: str | None = Field(default=None, pattern=MODEL_URI)
    catalog: str = Field(default="Qwen3-8B", json_schema_extra={"enum": list(MODELS)})

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


class Dataset(_Spec):
    """Where prompts come from: a built-in task (prompts and verifier in the trainer), or
    `external`, whose prompts and rewards an external trainer posts to the trainer's API."""

    task: Literal["digits", "arithmetic", "external"] = "digits"


class TrainerSpec(_Spec):
    """The trainer's pod: its image, devices and where it may run; and the update rule.
    `keepState` keeps the ledger and weights' volume after the run is deleted."""

    image: str | None = None
    resources: dict[str, Quantity] = {}
    node_selector: dict[str, LabelValue] = Field(default={}, max_length=64)
    tolerations: list[Toleration] = []
    template: PodOverlay = PodOverlay()
    storage: Quantity = "20Gi"
    keep_state: bool = False
    learning_rate: float = Field(default=2e-2, ge=0)
    advantages: Literal["group", "batch"] = "group"
    clip_eps: float = Field(default=0.2, gt=0)
    epochs: int = Field(default=1, ge=1)

    _keys = field_validator("node_selector")(_label_keys)


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


class SchedulerSpec(_Spec):
    """`hMin` and `delta` are `auto` or pinned tokens. Auto: each worker's floor and
    reserve are derived every cycle from its step cost and the control period, never
    below 256 and 16 tokens, which also size the pool's workers."""

    policy: str = Field(default="cadence", json_schema_extra={"enum": list(POLICIES)})
    eta: int = Field(default=1, ge=0)
    delta: AutoOrTokens = Field(default="auto", json_schema_extra=AUTO_OR_TOKENS)
    h_min: AutoOrTokens = Field(default="auto", json_schema_extra=AUTO_OR_TOKENS)
    control_period_s: float = Field(default=0.5, gt=0)
    min_decode: int = Field(default=4, ge=1)  # anti-thrash minimum
    # Start concentration even when no newer version has fresh work for the emptied
    # source (the Cadence policy's experiment switch, off by default).
    concentrate_without_fresh: bool = False

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
    status: TrainingRunStatus | None = None

    @model_validator(mode="after")
    def _names(self) -> Self:
        _check_name(self.metadata.name, RUN_NAME_MAX, "run")
        return self


# --- status, written by the operator -------------------------------------------------------


class Condition(_Spec):
    """A Kubernetes condition: `Ready`, `Progressing` or `Degraded` here."""

    type: str = Field(max_length=64)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(default="", max_length=128)
    message: str = Field(default="", max_length=1024)
    last_transition_time: str | None = None
    observed_generation: int | None = None


# Conditions as Kubernetes lists them: one per type, merged by type on apply.
Conditions = Annotated[
    list[Condition],
    Field(
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    ),
]


class GroupStatus(_Spec):
    name: str
    ready: int = 0
    desired: int = 0
    versions: list[int] = []
    mean_context: float = 0.0
    headroom_tokens: int = 0
    pending_trajectories: int = 0
    pending_tokens: int = 0


class RolloutPoolStatus(_Spec):
    ready: str = "0/0"  # ready workers / desired, as `kubectl get` shows it
    workers: int = 0
    run: str | None = None  # the TrainingRun it serves
    versions: str = ""  # policy versions served, e.g. "3,4"
    tokens_per_second: float = 0.0
    groups: list[GroupStatus] = []
    conditions: Conditions = []


class TrainingRunStatus(_Spec):
    phase: Literal["Pending", "Waiting", "Running", "Succeeded", "Failed", "Degraded"] = "Pending"
    policy_version: int = 0
    step: int = 0
    tokens_per_second: float = 0.0
    latency_p50_s: float = 0.0
    latency_p95_s: float = 0.0
    tokens_per_dollar: float = 0.0
    # Knobs that hold but hurt, one sentence each (a pinned hMin below one control
    # period's growth on some worker).
    warnings: list[str] = []
    conditions: Conditions = []


class RolloutGroupSpec(GroupSettings):
    """One group of a pool as its own resource, owned by the pool. Its `replicas` is the
    one owner of the group's size once created (the `/scale` subresource points here, so
    HPA or KEDA may drive it); the pool's `replicas` was only the initial value."""

    pool: str = Field(pattern=DNS_LABEL, max_length=63)
    group: str = Field(pattern=DNS_LABEL, max_length=63)
    replicas: int = Field(ge=0)  # always present: /scale reads and writes it


class RolloutGroupStatus(_Spec):
    replicas: int = 0
    ready_replicas: int = 0
    selector: str = ""  # the label selector of its pods, for /scale
    versions: list[int] = []
    mean_context: float = 0.0
    headroom_tokens: int = 0
    pending_tokens: int = 0  # work waiting for a worker of this type
    pending_trajectories: int = 0
    conditions: Conditions = []


class RolloutGroup(_Spec):
    api_version: Literal["cadence.dev/v1alpha1"]
    kind: Literal["RolloutGroup"]
    metadata: Metadata
    spec: RolloutGroupSpec
    status: RolloutGroupStatus | None = None


def groups_of(pool: RolloutPool) -> list[RolloutGroup]:
    """The RolloutGroups a pool owns, one per group, named `<pool>-<group>`, starting at
    the pool's `replicas` (afterwards the RolloutGroup's own `replicas` rules)."""
    out = []
    for g in pool.spec.groups:
        settings = g.model_dump(exclude={"name"})
        out.append(
            RolloutGroup(
                api_version="cadence.dev/v1alpha1",
                kind="RolloutGroup",
                metadata=Metadata(
                    name=f"{pool.metadata.name}-{g.name}", namespace=pool.metadata.namespace
                ),
                spec=RolloutGroupSpec(pool=pool.metadata.name, group=g.name, **settings),
            )
        )
    return out


def check_pair(pool: RolloutPool, run: TrainingRun) -> None:
    """Rules across the two resources."""
    if run.spec.pool != pool.metadata.name:
        raise ResourceError(
            f"TrainingRun spec.pool: it names pool {run.spec.pool!r}, "
            f"but the pool here is {pool.metadata.name!r}"
        )
    from cadence.operator.api.capacity import check_capacity  # noqa: PLC0415 (it imports this)
    from cadence.operator.scheduler.errors import StrandingError  # noqa: PLC0415

    try:
        check_capacity(pool, run)
    except StrandingError as e:
        raise ResourceError(f"TrainingRun {_blamed(pool, run)}: {e}") from None


def _blamed(pool: RolloutPool, run: TrainingRun) -> str:
    """The field a capacity refusal names: a pinned floor or reserve when leaving it auto
    would fit, else the model."""
    from cadence.operator.api.capacity import check_capacity  # noqa: PLC0415
    from cadence.operator.scheduler.errors import StrandingError  # noqa: PLC0415

    s = run.spec.scheduler
    pinned = [name for name, v in (("hMin", s.h_min), ("delta", s.delta)) if v != "auto"]
    if not pinned:
        return "spec.model"
    auto = s.model_copy(update={"h_min": "auto", "delta": "auto"})
    relaxed = run.model_copy(update={"spec": run.spec.model_copy(update={"scheduler": auto})})
    try:
        check_capacity(pool, relaxed)
    except StrandingError:
        return "spec.model"
    return " and ".join(f"spec.scheduler.{name}" for name in pinned)


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
