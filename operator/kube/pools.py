"""The RolloutPool reconciler: a pool's RolloutGroups (created once; afterwards each
group's `replicas` is the one owner of its size), the workers' headless Service, their
NetworkPolicy and the token Secret; its status sums its groups'."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cadence.operator.api.capacity import check_budget
from cadence.operator.api.resources import (
    API_VERSION,
    ResourceError,
    RolloutPool,
)
from cadence.operator.kube import children
from cadence.operator.kube.client import KubeError, path
from cadence.operator.kube.reconciling import (
    Events,
    Invalid,
    ReconcilerBase,
    Status,
    condition,
    pool_conditions,
    validated,
)


class PoolReconciler(ReconcilerBase):
    async def pool(self, body: Mapping[str, Any], events: Events) -> Status:
        pool: RolloutPool = validated(RolloutPool, body)
        try:
            check_budget(pool)
        except ResourceError as e:
            raise Invalid(str(e).removeprefix("RolloutPool ")) from None
        ns = pool.metadata.namespace
        kept = set()
        refused = []  # one group the API server refuses must not hold up the others
        for group in children.rollout_groups(pool, body):
            name = group["metadata"]["name"]
            kept.add(name)
            try:
                await self._pool_group(ns, name, group, events)
            except KubeError as e:
                refused.append(f"RolloutGroup {name}: {e}")
        for old in await self.kube.list(
            path(API_VERSION, "rolloutgroups", ns), {"cadence.dev/pool": pool.metadata.name}
        ):
            name = old["metadata"]["name"]
            if name not in kept:
                # A group removed from the pool goes; its pods go with it (owner
                # references) and each drains on its SIGTERM.
                await self.kube.delete(path(API_VERSION, "rolloutgroups", ns, name))
                events.append(("Removed", f"RolloutGroup {name}: no longer in the pool"))
        await self.kube.ensure(children.headless_service(pool, body))
        await self.kube.ensure(children.token_secret(pool, body))
        await self._ensure_spec(
            children.worker_policy(
                pool,
                body,
                operator_namespace=self.operator_namespace,
                scrapers_namespace=self.scrapers_namespace,
            )
        )
        bound = (body.get("status") or {}).get("run")
        run_obj = (
            await self.kube.get(path(API_VERSION, "trainingruns", ns, bound)) if bound else None
        )
        if bound and run_obj is None:
            # Its run was deleted (its trainer goes with it, by owner references): the
            # workers go too, and the pool may serve the next run.
            await self._release(ns, pool.metadata.name, events)
        groups = await self.kube.list(
            path(API_VERSION, "rolloutgroups", ns), {"cadence.dev/pool": pool.metadata.name}
        )
        degraded = condition("Degraded", False, "Valid", "the spec is valid")
        if refused:
            said = "; ".join(refused)
            degraded = condition("Degraded", True, "GroupRefused", said)
            events.append(("ReconcileError", said))
        ready = sum((g.get("status") or {}).get("readyReplicas", 0) for g in groups)
        desired = sum(g["spec"]["replicas"] for g in groups)
        workers = sum((g.get("status") or {}).get("replicas", 0) for g in groups)
        versions = sorted({v for g in groups for v in (g.get("status") or {}).get("versions", [])})
        return {
            "ready": f"{ready}/{desired}",
            "workers": workers,
            "versions": ",".join(str(v) for v in versions),
            "tokensPerSecond": ((run_obj or {}).get("status") or {}).get("tokensPerSecond", 0.0),
            "groups": [
                {
                    "name": g["spec"]["group"],
                    "ready": (g.get("status") or {}).get("readyReplicas", 0),
                    "desired": g["spec"]["replicas"],
                    **{
                        key: (g.get("status") or {})[key]
                        for key in (
                            "versions",
                            "meanContext",
                            "headroomTokens",
                            "pendingTrajectories",
                            "pendingTokens",
                        )
                        if key in (g.get("status") or {})
                    },
                }
                for g in groups
            ],
            "conditions": [
                *pool_conditions(ready, desired, serving=run_obj is not None),
                degraded,
            ],
        }

    async def _pool_group(
        self, ns: str, name: str, group: Mapping[str, Any], events: Events
    ) -> None:
        existing, created = await self.kube.ensure(group)
        if created:
            events.append(("Created", f"RolloutGroup {name}"))
            return
        # The pool's settings reach its groups on every change; `replicas` stays the
        # group's own (HPA's, /scale's) while it is within the bounds. Its pods follow,
        # one at a time (`group`).
        drift = children.group_drift(existing["spec"], group["spec"])
        if drift:
            await self.kube.patch(path(API_VERSION, "rolloutgroups", ns, name), {"spec": drift})
            events.append(("Updated", f"RolloutGroup {name}: {', '.join(sorted(drift))}"))
