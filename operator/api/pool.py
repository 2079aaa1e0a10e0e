"""`RolloutPool`: groups of rollout workers, one accelerator type each (count, affinity
rank, price, the engine's settings and what a platform adds to the pods). Rules within a
pool are checked here; rules across the pool and a run in `capacity`."""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from cadence.common.catalog import ACCELERATORS
from cadence.common.pool import Affinity, CustomAccelerator, PricePerHour, TensorParallel
from cadence.operator.api.base import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    IMAGE,
    KNOWN_ACCELERATOR,
    MAX_LENGTH,
    MAX_REPLICAS,
    POOL_AND_GROUP_MAX,
    POOL_NAME_MAX,
    REPLICA_BOUNDS,
    RESERVED_ENV,
    RESERVED_VOLUMES,
    LabelValue,
    Metadata,
    Quantity,
    Spec,
    cel_rule,
    check_name,
    label_keys,
)
from cadence.operator.api.status import RolloutPoolStatus


class EngineSettings(Spec):
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


class Toleration(Spec):
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
class PodOverlay(Spec):
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

    _keys = field_validator("labels")(label_keys)

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


class GroupSettings(Spec):
    """What a group of workers of one accelerator type runs with (a pool's group and a
    RolloutGroup share it)."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [KNOWN_ACCELERATOR, REPLICA_BOUNDS]}
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

    _keys = field_validator("node_selector")(label_keys)

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


class AutoscalingSpec(Spec):
    """The operator resizes the pool's groups as the run goes (off unless enabled): each
    period, from what its control loop sees, it sets every RolloutGroup's replicas
    through `/scale`, within the group's minReplicas and maxReplicas, never letting the
    pool cost more than budgetPerHour (workers being let go count until they are gone).
    A pool short of KV grows the group that buys the most (tok/$, or tok/s per worker
    for tailLatency); trajectories waiting for a group (the tail) grow that group; a
    pool with little to decode and no fresh work waiting lets the group that buys the
    least go, through the drain rule. The RolloutPool's status and Events say each
    decision and its reason."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel_rule(
                    "!self.enabled || has(self.budgetPerHour)",
                    "autoscaling needs budgetPerHour when enabled",
                )
            ]
        }
    )

    enabled: bool = False
    """Run the autoscaler for this pool's groups."""
    budget_per_hour: float | None = Field(default=None, gt=0)
    """The most the pool may cost an hour, by its groups' pricePerHour (required when
    enabled)."""
    objective: Literal["throughputPerDollar", "tailLatency"] = "throughputPerDollar"
    """throughputPerDollar: grow the type with the most measured tok/s per dollar;
    tailLatency: the type with the most tok/s per worker."""
    period_s: float = Field(default=30.0, gt=0, le=3600)
    """How often the targets are computed."""
    scale_up_stabilization_s: float = Field(default=60.0, ge=0, le=86400)
    """A group grows only to what every computation of this window asked for."""
    scale_down_stabilization_s: float = Field(default=300.0, ge=0, le=86400)
    """A group shrinks only to the most any computation of this window asked for."""
    max_step: int = Field(default=4, ge=1, le=1000)
    """Workers one decision adds to or removes from a group."""
    target_utilization: float = Field(default=0.75, gt=0, le=1)
    """The share of the pool's KV its work should fill."""
    demand_memory_s: float = Field(default=900.0, ge=0, le=86400)
    """How long the most KV the run's work needed is remembered: a tail phase or an
    update lets go of no worker the next batch will need."""
    export_only: bool = False
    """Compute and export the targets (the cadence_group_desired_replicas metric, the
    status) but write no /scale: an HPA or KEDA acts on the metric instead."""

    @model_validator(mode="after")
    def _budget(self) -> Self:
        if self.enabled and self.budget_per_hour is None:
            raise ValueError("autoscaling needs budgetPerHour when enabled")
        return self


class RolloutPoolSpec(Spec):
    """Groups of rollout workers, one accelerator type each, and the image they run."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel_rule(
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
    autoscaling: AutoscalingSpec = AutoscalingSpec()
    """The operator's autoscaler for the pool's groups; off by default."""

    @model_validator(mode="after")
    def _unique(self) -> Self:
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError("group names must be unique")
        return self


class RolloutPool(Spec):
    api_version: Literal["cadence.dev/v1alpha1"]
    kind: Literal["RolloutPool"]
    metadata: Metadata
    spec: RolloutPoolSpec
    status: RolloutPoolStatus | None = None

    @model_validator(mode="after")
    def _names(self) -> Self:
        name = self.metadata.name
        check_name(name, POOL_NAME_MAX, "pool")
        for g in self.spec.groups:
            if len(name) + len(g.name) > POOL_AND_GROUP_MAX:
                raise ValueError(
                    f"pool {name!r} and group {g.name!r} have {len(name) + len(g.name)} "
                    f"characters together; at most {POOL_AND_GROUP_MAX} (worker pods are "
                    "named pool-group-index)"
                )
        return self
