"""The operator's side of the autoscaler (`scheduler/autoscale.py` holds the rule): each
period of a pool's `spec.autoscaling`, from what the run's control loop saw, each group's
signals; the rule's targets written through each RolloutGroup's `/scale` (not with
`exportOnly`), where the group's own reconcile adds pods or drains them (scale-in goes
through the drain rule, so nothing resident is lost); every decision said in the pool's
status (`status.autoscaling`) and, where a target changes, an Event on the pool; and
the targets exported as `cadence_group_desired_replicas`, for a cluster that prefers an
HPA or KEDA to act.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from cadence.operator.api.capacity import hourly_price
from cadence.operator.api.pool import AutoscalingSpec
from cadence.operator.api.resources import API_VERSION, RolloutPool
from cadence.operator.kube.client import KubeApi, KubeError, path
from cadence.operator.kube.events import Post
from cadence.scheduler.actions import Action
from cadence.scheduler.autoscale import (
    AutoscaleSpec,
    AutoscaleState,
    Decision,
    GroupShape,
    GroupSignal,
    PoolSignal,
    admission_room,
    decide,
    fresh_waiting,
)
from cadence.scheduler.snapshot import Snapshot

log = logging.getLogger("cadence.operator")

OBJECTIVES = {"throughputPerDollar": "throughput_per_dollar", "tailLatency": "tail_latency"}


def rule_spec(spec: AutoscalingSpec) -> AutoscaleSpec:
    assert spec.budget_per_hour is not None
    return AutoscaleSpec(
        budget_per_hour=spec.budget_per_hour,
        objective=OBJECTIVES[spec.objective],  # type: ignore[arg-type]
        period_s=spec.period_s,
        scale_up_stabilization_s=spec.scale_up_stabilization_s,
        scale_down_stabilization_s=spec.scale_down_stabilization_s,
        max_step=spec.max_step,
        target_utilization=spec.target_utilization,
        demand_memory_s=spec.demand_memory_s,
    )


@dataclass(frozen=True)
class Seen:
    """What the run's control loop saw in its last cycle, as the autoscaler reads it."""

    plan: tuple[Snapshot, Sequence[Action]]
    shapes: Sequence[GroupShape]
    members: Mapping[str, str]  # worker pod name: RolloutGroup name (terminating too)
    decoded: Mapping[str, int]  # worker pod name: tokens its engine decoded
    # RolloutGroup name: (trajectories, tokens) the plan left waiting for it, as the
    # group's status reports them (`group_stats`); a group not named waits for none.
    waiting: Mapping[str, tuple[int, int]] = field(default_factory=dict)


@dataclass
class Autoscaler:
    kube: KubeApi
    post: Post
    clock: Callable[[], float]
    state: AutoscaleState = field(default_factory=AutoscaleState)
    next_at: float | None = None
    decoded: dict[str, tuple[float, int]] = field(default_factory=dict)  # group: (at, tokens)
    desired: dict[str, int] = field(default_factory=dict)  # RolloutGroup name: target

    async def step(self, pool: RolloutPool, pool_obj: Mapping[str, Any], seen: Seen) -> None:
        """Decide and act, once each period of the pool's `spec.autoscaling`."""
        spec = pool.spec.autoscaling
        now = self.clock()
        if not spec.enabled or (self.next_at is not None and now < self.next_at):
            return
        self.next_at = now + spec.period_s
        ns, name = pool.metadata.namespace, pool.metadata.name
        try:
            groups = {
                g["metadata"]["name"]: g
                for g in await self.kube.list(path(API_VERSION, "rolloutgroups", ns))
            }
        except (KubeError, httpx.TransportError) as e:
            log.warning("autoscaler of %s/%s: reading its groups failed: %s", ns, name, e)
            return
        signal = self._signal(pool, seen, groups, now)
        decisions, self.state = decide(signal, rule_spec(spec), self.state)
        self.desired = {d.group: d.replicas for d in decisions}
        for d in decisions:
            if d.changed and not spec.export_only:
                await self._scale(ns, d)
            if d.changed:
                before = next(g.replicas for g in signal.groups if g.name == d.group)
                verb = "AutoscaledOut" if d.replicas > before else "AutoscaledIn"
                self.post(pool_obj, verb, f"{d.group}: {before} -> {d.replicas}: {d.reason}", False)
        await self._status(ns, name, signal, decisions, spec)

    def _signal(
        self, pool: RolloutPool, seen: Seen, groups: Mapping[str, Mapping[str, Any]], now: float
    ) -> PoolSignal:
        snapshot, actions = seen.plan
        shapes, members, decoded = seen.shapes, seen.members, seen.decoded
        views = {w.id: w for w in snapshot.workers}
        by_group = {f"{pool.metadata.name}-{g.name}": g for g in pool.spec.groups}
        out = []
        for shape in shapes:
            g = by_group[shape.name]
            pods = [p for p, group in members.items() if group == shape.name]
            held = [views[p] for p in pods if p in views]
            tokens = sum(decoded.get(p, 0) for p in pods)
            at, before = self.decoded.get(shape.name, (now, tokens))
            self.decoded[shape.name] = (now, tokens)
            spec = groups.get(shape.name, {}).get("spec", {})
            out.append(
                GroupSignal(
                    name=shape.name,
                    affinity=shape.affinity,
                    capacity=shape.capacity,
                    worker_price=hourly_price(g),
                    workers=len(pods),
                    replicas=int(spec.get("replicas", g.replicas)),
                    min_replicas=int(spec.get("minReplicas", g.min_replicas)),
                    max_replicas=int(spec.get("maxReplicas", g.max_replicas)),
                    used_tokens=sum(r.context for w in held for r in w.residents),
                    residents=sum(len(w.residents) for w in held),
                    decode_tok_s=max(0, tokens - before) / (now - at) if now > at else 0.0,
                    pending_tokens=seen.waiting.get(shape.name, (0, 0))[1],
                    pending_trajectories=seen.waiting.get(shape.name, (0, 0))[0],
                )
            )
        return PoolSignal(
            tuple(out), fresh_waiting(snapshot, actions), admission_room(snapshot), now
        )

    async def _scale(self, ns: str, d: Decision) -> None:
        url = path(API_VERSION, "rolloutgroups", ns, d.group) + "/scale"
        try:
            await self.kube.patch(url, {"spec": {"replicas": d.replicas}})
        except (KubeError, httpx.TransportError) as e:
            log.warning("autoscaler: scaling %s to %d failed: %s", d.group, d.replicas, e)

    async def _status(
        self,
        ns: str,
        name: str,
        signal: PoolSignal,
        decisions: Sequence[Decision],
        spec: AutoscalingSpec,
    ) -> None:
        cost = sum(
            max(g.workers, d.replicas) * g.worker_price
            for g, d in zip(signal.groups, decisions, strict=True)
        )
        status = {
            "decidedAt": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "costPerHour": round(cost, 4),
            "budgetPerHour": spec.budget_per_hour,
            "groups": [
                {"name": d.group, "replicas": d.replicas, "reason": d.reason} for d in decisions
            ],
        }
        url = path(API_VERSION, "rolloutpools", ns, name) + "/status"
        try:
            await self.kube.patch(url, {"status": {"autoscaling": status}})
        except (KubeError, httpx.TransportError) as e:
            log.warning("autoscaler: writing %s's status failed: %s", name, e)
