"""What the operator writes: each kind's status, with Kubernetes conditions."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
)

from cadence.operator.api.base import Spec


class Condition(Spec):
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


class GroupStatus(Spec):
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


class GroupTarget(Spec):
    """One group's target as the autoscaler last computed it, and why."""

    name: str
    """The RolloutGroup."""
    replicas: int
    """Its target."""
    reason: str
    """Why, in a sentence."""


class AutoscalingStatus(Spec):
    """What the autoscaler last decided (spec.autoscaling)."""

    decided_at: str = ""
    """When, as an RFC 3339 time."""
    cost_per_hour: float = 0.0
    """What the pool's workers cost an hour then, those being let go included."""
    budget_per_hour: float = 0.0
    """The budget it kept within."""
    groups: list[GroupTarget] = []
    """Each group's target and its reason."""


class RolloutPoolStatus(Spec):
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
    autoscaling: AutoscalingStatus | None = None
    """The autoscaler's last decision, while it runs."""


class TrainingRunStatus(Spec):
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
