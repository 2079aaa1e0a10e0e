"""`RolloutGroup`: one group of a RolloutPool as its own object, owned by the pool, with
the `/scale` subresource an autoscaler drives (`groups_of` makes a pool's)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
)

from cadence.operator.api.base import DNS_LABEL, Metadata, Spec, cel_same
from cadence.operator.api.pool import GroupSettings, RolloutPool
from cadence.operator.api.status import Conditions


def _group_fixed(field: str) -> str:
    return f"spec.{field} cannot change: the group's pods are named after it, and would be orphaned"


class RolloutGroupSpec(GroupSettings):
    """One group of a pool as its own resource, owned by the pool. Its `replicas` is the
    one owner of the group's size once created (the `/scale` subresource points here, so
    HPA or KEDA may drive it); the pool's `replicas` was only the initial value."""

    pool: str = Field(
        pattern=DNS_LABEL,
        max_length=63,
        json_schema_extra={"x-kubernetes-validations": [cel_same(_group_fixed("pool"))]},
    )
    """The RolloutPool that owns the group; fixed (its pods are named and labelled by
    it)."""
    group: str = Field(
        pattern=DNS_LABEL,
        max_length=63,
        json_schema_extra={"x-kubernetes-validations": [cel_same(_group_fixed("group"))]},
    )
    """The group's name in its pool; fixed (its pods are named and labelled by it)."""
    replicas: int = Field(ge=0)
    """Worker pods the group runs: the one owner of its size, always present, which
    /scale reads and writes (kubectl scale, an HPA, KEDA)."""


class RolloutGroupStatus(Spec):
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


class RolloutGroup(Spec):
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
