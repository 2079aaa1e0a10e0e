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

import importlib.metadata
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from cadence.common.catalog import ACCELERATORS, MODELS
from cadence.common.pool import Affinity, CustomAccelerator, PricePerHour, TensorParallel
from cadence.scheduler.registry import POLICIES
from cadence.sim.scenario import (
    AutoOrTokens,
    EmpiricalLengthsSpec,
    LengthLawSpec,
    LognormalLengths,
    MixtureComponent,
    MixtureLengthsSpec,
)
from cadence.worker.api import greedy_or_above_the_floor


def _version() -> str:
    try:
        return importlib.metadata.version("cadence")
    except importlib.metadata.PackageNotFoundError:  # a source tree never installed
        return "0.0.0"


# The image built from this version (Containerfile); its tag follows the package's.
IMAGE = f"cadence:{_version()}"
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
MAX_LENGTH = 1_048_576  # tokens: no response is longer


class ResourceError(ValueError):
    """A resource that does not validate; the message is one sentence."""


class _Spec(BaseModel):
    # A field's docstring (the string under it) is its description in the JSON schema,
    # so in the CRDs and in `kubectl explain`.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )


class EngineSettings(_Spec):
    """How each worker of a group starts its inference engine (vLLM on a cluster)."""

    backend: Literal["vllm", "emulated"] = "vllm"
    """The engine: vLLM on the group's accelerators, or the emulated engine (the
    accelerator's roofline, no device; for a cluster without accelerators, such as a
    kind cluster testing the control plane)."""
    tensor_parallel: TensorParallel | None = None
    """Devices one worker's engine spans (tensor parallelism); unset: the smallest degree
    that holds the longest trajectory plus hMin + delta, which the capacity check plans
    with and every worker is started at."""
    max_model_len: int = Field(default=4096, ge=16, le=MAX_LENGTH)
    """The longest trajectory (prompt and response) a worker serves, in tokens (vLLM's
    max_model_len); every group must hold the pool's longest plus hMin + delta."""
    memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """The share of each device's memory the engine may take, above 0 and at most 1
    (vLLM's gpu_memory_utilization); what the weights leave is KV cache."""


class Toleration(_Spec):
    """A Kubernetes toleration: the pod may run on nodes with a matching taint."""

    key: str | None = None
    """The taint's key; unset with operator Exists: every taint."""
    operator: Literal["Equal", "Exists"] = "Equal"
    """Equal: the taint's key and value match; Exists: its key alone does."""
    value: str | None = None
    """The taint's value, for operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect tolerated; unset: every effect."""


# Kubernetes' own patterns: a resource quantity (`1`, `500m`, `16Gi`; without its minus
# sign, as no request may be negative) and a label's key and value, so a bad device count
# or node selector is refused where it is written.
QUANTITY = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
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
    if value.startswith("-"):
        raise ValueError(f"{value} is negative; a quantity is at least 0")
    if not re.fullmatch(QUANTITY, value):
        raise ValueError(f"{value!r} is not a quantity (a number, or a string like 500m or 16Gi)")
    return value


# A device or memory request as Kubernetes writes it: `nvidia.com/gpu: 1` or `"16Gi"`.
Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}],
            "pattern": QUANTITY,
            # An int-or-string carries no minimum in a CRD (the anyOf collapses): an
            # integer -1 passed. A rule of constant cost per value, unlike a regex rule.
            "x-kubernetes-validations": [
                {"rule": "type(self) != int || self >= 0", "message": "a quantity is at least 0"}
            ],
        }
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
    validator next to it checks the same, so both paths refuse the same objects (but for
    the transition rules below, which only the API server can check)."""
    return {"rule": rule, "message": message}


# Immutability, as CEL transition rules: what the operator cannot honour once an object
# exists. The API server checks them on updates only, with the stored object as
# `oldSelf` (never on create), so no model can check them: a file has no old object.
def _same(message: str) -> JsonDict:
    """On a field that is always present (required): it keeps its first value."""
    return _rule("self == oldSelf", message)


def _kept(field: str, message: str) -> JsonDict:
    """On the object holding `field` (its camelCase name): the field is never added,
    removed or changed. On the parent, not the field, because a field's own rule runs
    only when the field is in both objects, and one whose default is an object has no
    default in the CRD (the API server would not fill it in)."""
    return _rule(
        f"has(self.{field}) == has(oldSelf.{field})"
        f" && (!has(self.{field}) || self.{field} == oldSelf.{field})",
        message,
    )


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
RESERVED_VOLUMES = frozenset({"shm", "weights", "models", "state", "config"})
# UCX_TCP_PORT_RANGE keeps the KV data plane within the ports its NetworkPolicy opens.
RESERVED_ENV = frozenset({"CADENCE_TOKEN", "UCX_TCP_PORT_RANGE"})


class PodOverlay(_Spec):
    """What a platform adds to the pods the operator makes, as KubeRay's and
    LeaderWorkerSet's pod templates let it: placement (affinity, topology spread,
    priority, a gang scheduler's name), identity (service account, pull secrets,
    runtime class), and extra env, volumes and mounts for the main container. Merged over
    what the operator sets: its labels, selectors, arguments, ports and probes stay its
    own; the Kubernetes objects inside (affinity, a volume) are checked by the API server
    when the pod is made, and a refusal is the group's `Degraded` condition."""

    labels: dict[str, LabelValue] = Field(default={}, max_length=64)
    """Labels added to the pods; the operator's own keys keep the operator's values."""
    annotations: dict[str, str] = Field(default={}, max_length=64)
    """Annotations added to the pods."""
    affinity: dict[str, Any] | None = Field(default=None)
    """The pods' affinity, a Kubernetes Affinity (node, pod and pod anti-affinity)."""
    topology_spread_constraints: list[dict[str, Any]] = Field(default=[], max_length=16)
    """The pods' topologySpreadConstraints, as Kubernetes writes them."""
    priority_class_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN)
    """The PriorityClass the pods run at."""
    scheduler_name: str | None = Field(default=None, min_length=1)
    """The scheduler that places the pods (a gang scheduler such as volcano); unset: the
    cluster's default scheduler."""
    service_account_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN)
    """The ServiceAccount the pods run as; unset: the namespace's default."""
    automount_service_account_token: bool | None = None
    """Whether the pods get an API token mounted; unset: they get none."""
    runtime_class_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN)
    """The RuntimeClass the pods run with (for example nvidia)."""
    image_pull_secrets: list[str] = Field(default=[], max_length=16)
    """Names of Secrets in the namespace the images are pulled with."""
    env: list[dict[str, Any]] = Field(default=[], max_length=64)
    """Environment variables (Kubernetes EnvVar objects) added to the main container,
    after the operator's own; CADENCE_TOKEN and UCX_TCP_PORT_RANGE are the operator's."""
    volumes: list[dict[str, Any]] = Field(default=[], max_length=32)
    """Volumes (Kubernetes Volume objects) added to the pods; shm, models, state and
    config are the operator's names."""
    volume_mounts: list[dict[str, Any]] = Field(default=[], max_length=32)
    """Mounts (Kubernetes VolumeMount objects, each with a name and a mountPath) added to
    the main container."""

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
    """The workers' accelerator type: a catalog name (A100-80GB, A910X, Ascend910B3,
    Ascend910B4, BI-V150, H100, H20, H200, H800, L40S, MI300X), or any name with its
    figures under custom; the capacity check, the scheduler's step costs and an emulated
    worker follow it, and the pods carry it as the label cadence.dev/accelerator."""
    custom: CustomAccelerator | None = None
    """The figures of an accelerator type the catalog lacks; unset: the catalog's."""
    affinity: Affinity = 0
    """The group's affinity rank: a version's long tail concentrates on the workers of
    the highest rank, so give the fastest type the highest number."""
    replicas: int = Field(default=1, ge=0)
    """Worker pods in the group (one worker each); in a pool, only the number its
    RolloutGroup starts with, which then owns the group's size."""
    min_replicas: int = Field(default=0, ge=0)
    """The fewest workers replicas may be set to (by hand, or an autoscaler's /scale)."""
    max_replicas: int = Field(default=64, ge=0, le=MAX_REPLICAS)
    """The most workers replicas may be set to."""
    resources: dict[str, Quantity] = {}
    """What each worker pod requests, as Kubernetes quantities (nvidia.com/gpu: 1,
    memory: 64Gi); devices are limits too, and cpu and memory default to 2 and 8Gi."""
    # Keys are checked by the model, not by CEL: a rule over a map's keys, whose length
    # no schema bounds, can exceed the API server's cost budget for a CRD.
    node_selector: dict[str, LabelValue] = Field(default={}, max_length=64)
    """Node labels a worker pod's node must have (the pod's nodeSelector)."""
    tolerations: list[Toleration] = []
    """Node taints the worker pods tolerate."""
    price_per_hour: PricePerHour | None = None
    """One worker's price, in dollars per hour, for the run's tokens per dollar; unset:
    the catalog's price under `cadence run`, 0 in the operator."""
    engine: EngineSettings = EngineSettings()
    """How each worker starts its engine: tensor parallelism, context length, memory."""
    template: PodOverlay = PodOverlay()
    """What a platform adds to the worker pods (placement, identity, extra env, volumes
    and mounts); a change replaces the group's pods one at a time."""

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
        tp, devices = self.engine.tensor_parallel, self.devices
        if tp is not None and devices is not None and tp > devices:
            raise ValueError(
                f"engine.tensorParallel {tp} needs {tp} devices in each worker pod, but "
                f"its resources request {devices}"
            )
        return self

    @property
    def devices(self) -> int | None:
        """The accelerator devices each worker pod requests (nvidia.com/gpu, amd.com/gpu,
        huawei.com/Ascend910, ...); None when its resources name none (an emulated
        group, or devices a platform attaches by other means)."""
        counts = [
            int(value)
            for key, value in self.resources.items()
            if key.startswith(ACCELERATOR_RESOURCES) and str(value).isdigit()
        ]
        return sum(counts) if counts else None


# Extended resources that are accelerator devices a tensor-parallel degree uses.
ACCELERATOR_RESOURCES = (
    "nvidia.com/",
    "amd.com/gpu",
    "huawei.com/ascend",
    "huawei.com/Ascend",
    "intel.com/gpu",
    "habana.ai/",
    "iluvatar.ai/",
)


class PoolGroup(GroupSettings):
    """Workers of one accelerator type. `replicas` is the initial count; afterwards the
    group's own resource (`RolloutGroup`) owns it, so an autoscaler may drive it."""

    name: str = Field(pattern=DNS_LABEL, max_length=63)
    """The group's name, unique in the pool: its RolloutGroup is named POOL-NAME and its
    worker pods POOL-NAME-INDEX."""


class RolloutPoolSpec(_Spec):
    """Groups of rollout workers, one accelerator type each, and the image they run."""

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
    """The pool's groups of workers, one accelerator type each (1 to 32, unique names);
    each becomes a RolloutGroup the pool owns."""
    image: str = IMAGE
    """The worker pods' container image (with vLLM for the cluster's accelerators), and
    the trainer's unless its run names another."""
    token_secret: str = Field(default="cadence-token", pattern=DNS_LABEL)
    """The Secret whose key `token` holds the bearer token the workers, the trainer and
    the operator share; the operator makes it with a random token if it is missing."""
    emulated_speed: float = Field(default=1.0, gt=0, le=1)
    """Groups on the emulated engine: how fast their modelled accelerators run, against
    the real ones (0.1: ten times slower, every step and prefill alike), so that a host
    without the accelerators can produce the tokens of a pool at its modelled pace.
    `cadence run --compression` overrides it."""
    tls_secret: str | None = Field(default=None, pattern=DNS_LABEL)
    """A kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt, as cert-manager makes one)
    whose certificate the pool's workers, trainers and environments serve HTTPS with, and
    whose ca.crt their clients trust; none: plain HTTP. It must name
    *.<pool>-workers.<namespace>.svc and <run>-trainer.<namespace>.svc
    (manifests/examples/tls.yaml)."""

    @model_validator(mode="after")
    def _unique(self) -> Self:
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError("group names must be unique")
        return self


class Metadata(_Spec):
    model_config = ConfigDict(extra="allow", frozen=True)  # labels, annotations, uid, ...

    name: str = Field(pattern=DNS_LABEL)
    """The object's name, which the names of what the operator makes for it start with."""
    namespace: str = "default"
    """The object's namespace, where everything made for it lives too."""


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


class Dataset(_Spec):
    """Where prompts come from: a built-in task (prompts and verifier in the trainer), or
    `external`, whose prompts and rewards an external trainer posts to the trainer's API."""

    task: Literal["digits", "arithmetic", "external"] = "digits"
    """digits or arithmetic: prompts and a verifier built into the trainer; external: an
    external trainer submits the prompts and trains each batch through the trainer's
    API."""


class TrainerSpec(_Spec):
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
    """The control loop's policy: cadence, or a baseline to compare it with (sync,
    one-off, areal, laminar, dora, laminar-native)."""
    eta: int = Field(default=1, ge=0)
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


class LengthComponent(_Spec):
    """One lognormal component of a mixture law, with its share of the samples."""

    weight: float = Field(gt=0, le=1e6)
    """Its share of the samples, relative to the other components' weights."""
    median_tokens: float = Field(gt=0, le=MAX_LENGTH)
    """Its median response length, in tokens."""
    sigma_between_groups: float = Field(default=0.5, ge=0, le=5)
    """The spread of a group's log-median (a hard prompt makes every sample long)."""
    sigma_within_group: float = Field(default=0.5, ge=0, le=5)
    """The spread of one sample's log-length around its group's."""


class ResponseLengths(_Spec):
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


class BatchSpec(_Spec):
    """The shape of a training batch and how its samples are drawn (the trainer's)."""

    prompts_per_batch: int = Field(default=8, ge=1)
    """B: prompts per training batch, each one a group of samples."""
    samples_per_prompt: int = Field(default=8, ge=2)
    """Samples drawn per prompt: the group whose rewards GRPO's advantages compare."""
    max_tokens: int = Field(default=12, ge=1)
    """The most tokens a sample's response may have."""
    response_lengths: ResponseLengths | None = None
    """Each sample's response length drawn from a law (capped at maxTokens) and decoded
    to whatever the model samples; unset: the model decides, up to maxTokens."""
    iterations: int = Field(default=12, ge=1)
    """Batches to train, each publishing the next policy version; the run succeeds after
    the last."""
    temperature: float = Field(default=1.0, ge=0)
    """The workers' sampling temperature (0: greedy, else at least 0.01, vLLM's floor),
    which the trainer scores at too."""

    _floor = field_validator("temperature")(greedy_or_above_the_floor)


class MultiTurnSpec(_Spec):
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


class CompletionSpec(_Spec):
    """What happens when the run has trained its last batch, as Kubeflow's trainers'
    run policies do: the workers are released as soon as it finishes."""

    stop_trainer: bool = True
    """Stop the trainer's pod (its StatefulSet to 0 replicas): it may hold many devices.
    Its state (ledger, weights) and Service stay; false keeps it serving."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=10**8)
    """Delete the TrainingRun (and so its trainer, state and all) this long after it
    finished; unset: keep it until deleted by hand."""


class TrainingRunSpec(_Spec):
    """What a run trains (model, dataset, batch, trainer), on which pool, and how its
    control loop schedules; only scheduler and multiTurn may change once it exists."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *(_kept(f, _run_fixed(f)) for f in RUN_FIXED if f != "pool"),
                # The trainer admits by eta too (its ConfigMap, made once): the loop and
                # the trainer must not hold two bounds. 1 is the default when absent.
                _rule(
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
        json_schema_extra={"x-kubernetes-validations": [_same(_run_fixed("pool"))]},
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
    """Ready, Progressing or Degraded."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds: True, False or Unknown."""
    reason: str = Field(default="", max_length=128)
    """Why, in one CamelCase word (PoolBusy, Invalid, ReconcileError, ...)."""
    message: str = Field(default="", max_length=1024)
    """Why, in a sentence for a person."""
    last_transition_time: str | None = None
    """When status last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The metadata.generation of the spec the condition was observed on."""


# Conditions as Kubernetes lists them: one per type, merged by type on apply.
Conditions = Annotated[
    list[Condition],
    Field(
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    ),
]


class GroupStatus(_Spec):
    """One group of a pool, as its RolloutGroup's status says."""

    name: str
    """The group's name in the pool."""
    ready: int = 0
    """Its ready workers."""
    desired: int = 0
    """Its RolloutGroup's replicas."""
    versions: list[int] = []
    """Policy versions its workers are on."""
    mean_context: float = 0.0
    """Mean context of its workers' residents, in tokens."""
    headroom_tokens: int = 0
    """Free KV per worker, on average, in tokens."""
    pending_trajectories: int = 0
    """Trajectories waiting for a worker of this group."""
    pending_tokens: int = 0
    """Those trajectories' context, in tokens."""


class RolloutPoolStatus(_Spec):
    """The pool's workers and what they serve, written by the operator."""

    ready: str = "0/0"
    """Ready workers / desired workers, as `kubectl get` shows it."""
    workers: int = 0
    """Worker pods that exist, in every group."""
    run: str | None = None
    """The TrainingRun the pool serves; unset: none."""
    versions: str = ""
    """Policy versions its workers are on, such as "3,4"."""
    tokens_per_second: float = 0.0
    """The throughput of the run it serves, in tokens per second."""
    groups: list[GroupStatus] = []
    """Each group's workers, versions and waiting work."""
    conditions: Conditions = []
    """Ready, Progressing and Degraded, one of each type."""


class TrainingRunStatus(_Spec):
    """The run's progress, written by the operator and the run's control loop."""

    phase: Literal[
        "Pending", "Waiting", "Starting", "Running", "Succeeded", "Failed", "Degraded"
    ] = "Pending"
    """Pending until the operator sees the run, Waiting for its pool (missing, or serving
    another run), Starting once bound, Running once its control loop runs, Succeeded
    after the last batch, Degraded while its spec is refused or its reconcile fails."""
    policy_version: int = 0
    """The newest policy version the trainer has published."""
    step: int = 0
    """Batches trained so far."""
    tokens_per_second: float = 0.0
    """Tokens delivered per second since the control loop started."""
    latency_p50_s: float = 0.0
    """Median trajectory latency (first decoding step to finish), in seconds."""
    latency_p95_s: float = 0.0
    """95th percentile trajectory latency, in seconds."""
    tokens_per_dollar: float = 0.0
    """Tokens delivered per dollar of the pool's pricePerHour so far; 0 without prices."""
    warnings: list[str] = []
    """Knobs that hold but hurt, one sentence each (a pinned hMin below one control
    period's growth on some worker)."""
    completion_time: str | None = None
    """When the run finished (RFC 3339), for ttlSecondsAfterFinished."""
    conditions: Conditions = []
    """Ready, Progressing and Degraded, one of each type."""


def _group_fixed(field: str) -> str:
    return f"spec.{field} cannot change: the group's pods are named after it, and would be orphaned"


class RolloutGroupSpec(GroupSettings):
    """One group of a pool as its own resource, owned by the pool. Its `replicas` is the
    one owner of the group's size once created (the `/scale` subresource points here, so
    HPA or KEDA may drive it); the pool's `replicas` was only the initial value."""

    pool: str = Field(
        pattern=DNS_LABEL,
        max_length=63,
        json_schema_extra={"x-kubernetes-validations": [_same(_group_fixed("pool"))]},
    )
    """The RolloutPool that owns the group; fixed (its pods are named and labelled by
    it)."""
    group: str = Field(
        pattern=DNS_LABEL,
        max_length=63,
        json_schema_extra={"x-kubernetes-validations": [_same(_group_fixed("group"))]},
    )
    """The group's name in its pool; fixed (its pods are named and labelled by it)."""
    replicas: int = Field(ge=0)
    """Worker pods the group runs: the one owner of its size, always present, which
    /scale reads and writes (kubectl scale, an HPA, KEDA)."""


class RolloutGroupStatus(_Spec):
    """The group's workers and the work waiting for them, written by the operator."""

    replicas: int = 0
    """Worker pods that exist."""
    ready_replicas: int = 0
    """Worker pods that are Ready."""
    selector: str = ""
    """The label selector of its pods, for /scale."""
    versions: list[int] = []
    """Policy versions its workers are on."""
    mean_context: float = 0.0
    """Mean context of its workers' residents, in tokens."""
    headroom_tokens: int = 0
    """Free KV per worker, on average, in tokens."""
    pending_tokens: int = 0
    """Context of the trajectories waiting for a worker of this group, in tokens."""
    pending_trajectories: int = 0
    """Trajectories waiting for a worker of this group (what an autoscaler scales on)."""
    conditions: Conditions = []
    """Ready and Degraded, one of each type."""


class RolloutGroup(_Spec):
    api_version: Literal["cadence.dev/v1alpha1"]
    kind: Literal["RolloutGroup"]
    metadata: Metadata
    spec: RolloutGroupSpec
    status: RolloutGroupStatus | None = None


def as_written(body: Mapping[str, Any]) -> dict[str, Any]:
    """A resource as its author wrote it, from the API server's object: kind, name,
    namespace, labels and spec (no status, no server-set metadata), for the models."""
    obj = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    obj["metadata"] = {
        k: v for k, v in body["metadata"].items() if k in ("name", "namespace", "labels")
    }
    return obj


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
