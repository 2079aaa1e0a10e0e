"""The RolloutGroup reconciler: worker pods up to `spec.replicas` while its pool serves a
run (a pod needs the run's model); above it, pods chosen by `scale_in.choose_for_scale_in`
are deleted and their SIGTERM drains them; a changed template replaces pods one at a
time. Status: replicas, ready, the selector /scale reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from cadence.operator.api.resources import (
    API_VERSION,
    RolloutGroup,
    RolloutPool,
    TrainingRun,
)
from cadence.operator.kube import children, scale_in
from cadence.operator.kube.client import KubeError, path
from cadence.operator.kube.reconciling import (
    Events,
    ReconcilerBase,
    Status,
    condition,
    pool_conditions,
    validated,
)

# What a run's loop writes into each of its groups' status (`run_report.py`).
from cadence.worker.client import WorkerClient, WorkerError

RUN_FIGURES = ("versions", "meanContext", "headroomTokens", "pendingTrajectories", "pendingTokens")


class GroupReconciler(ReconcilerBase):
    async def group(self, body: Mapping[str, Any], events: Events) -> Status:
        group: RolloutGroup = validated(RolloutGroup, body)
        ns, g = group.metadata.namespace, group.spec
        pool_obj = await self.kube.get(self._pool_url(ns, g.pool))
        run_name = ((pool_obj or {}).get("status") or {}).get("run")
        run_obj = (
            await self.kube.get(path(API_VERSION, "trainingruns", ns, run_name))
            if run_name
            else None
        )
        # A group whose pool (or itself) is gone or going makes nothing more: owner
        # references are collecting it, and what it made now would be orphaned for a
        # while (its pods were created for about 20 s after `kubectl delete rpool`).
        here = await self.kube.get(path(API_VERSION, "rolloutgroups", ns, group.metadata.name))
        going = any(
            obj is None or obj["metadata"].get("deletionTimestamp") for obj in (pool_obj, here)
        )
        if going:
            run_obj = None
        else:
            await self.kube.ensure(children.disruption_budget(group, body))
        selector = {"cadence.dev/pool": g.pool, "cadence.dev/group": g.group}
        pods = await self.kube.list(path("v1", "pods", ns), selector)
        live = []
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                continue
            if run_obj is None or pod["metadata"]["labels"].get("cadence.dev/run") != run_name:
                # A worker of a run that ended or went: it holds nothing of the pool's
                # run, so the scale-in rule does not apply.
                await self.kube.delete(path("v1", "pods", ns, pod["metadata"]["name"]))
                events.append(("Retired", f"pod {pod['metadata']['name']}: its run ended"))
                continue
            live.append(pod)
        desired = g.replicas if pool_obj is not None and run_obj is not None else 0
        if len(live) < desired:
            assert pool_obj is not None and run_obj is not None
            pool: RolloutPool = validated(RolloutPool, pool_obj)
            run: TrainingRun = validated(TrainingRun, run_obj)
            taken = {p["metadata"]["name"] for p in live}
            # A pod still Terminating holds its name until it goes: it counts as the
            # group's until then. Any other name the list did not show is created
            # without reading it first (a GET per new pod was 1,024 GETs for a pool of
            # 1,024 workers).
            holding = {
                p["metadata"]["name"]: p for p in pods if p["metadata"].get("deletionTimestamp")
            }
            index = 0
            while len(live) < desired:
                name = f"{group.metadata.name}-{index}"
                if name not in taken:
                    pod = holding.get(name) or await self._create_pod(
                        children.worker_pod(pool, group, body, run, index)
                    )
                    live.append(pod)
                index += 1
        elif live and run_obj is not None and pool_obj is not None:
            await self._roll(
                group,
                body,
                pool=validated(RolloutPool, pool_obj),
                run=validated(TrainingRun, run_obj),
                live=live,
                events=events,
            )
        if len(live) > desired:
            views, others, unfinished = await self._views(
                ns, g.pool, {p["metadata"]["name"] for p in live}
            )
            for name in scale_in.choose_for_scale_in(
                views, unfinished, len(live) - desired, others
            ):
                await self.kube.delete(path("v1", "pods", ns, name))
                events.append(("ScaledIn", f"pod {name} drains and goes"))
                live = [p for p in live if p["metadata"]["name"] != name]
        ready = sum(children.pod_ready(p) for p in live)
        status: Status = {
            "replicas": len(live),
            "readyReplicas": ready,
            "selector": children.group_selector(group),
            "conditions": [
                pool_conditions(ready, desired, serving=run_obj is not None)[0],
                condition("Degraded", False, "Valid", "the spec is valid"),
            ],
        }
        if run_obj is None:  # what a run's loop reported of the group ended with the run
            status.update(dict.fromkeys(RUN_FIGURES))
        return status

    async def _create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """`pod` created; if one of its name was made since the list (a retired pod of
        an earlier run, still Terminating, or another handler's), that one."""
        try:
            return await self.kube.create(pod)
        except KubeError as e:
            if e.status != 409:
                raise
        existing, _ = await self.kube.ensure(pod)
        return existing

    async def _roll(
        self,
        group: RolloutGroup,
        body: Mapping[str, Any],
        *,
        pool: RolloutPool,
        run: TrainingRun,
        live: list[dict[str, Any]],
        events: Events,
    ) -> None:
        """A pod whose template the group's spec no longer matches (a node selector,
        resources, the image, engine settings changed) is replaced, one at a time: it is
        deleted, its SIGTERM drains it, and the next reconcile makes its replacement from
        the new template. A stale pod that is not ready goes first, and at once, since it
        serves nothing; a ready one only while every other pod is ready (waiting for
        stale pods that cannot become ready would leave the group on a broken template
        for ever)."""
        pod = children.worker_pod(pool, group, body, run, 0)
        wanted = pod["metadata"]["labels"][children.TEMPLATE_LABEL]
        stale = [p for p in live if p["metadata"]["labels"].get(children.TEMPLATE_LABEL) != wanted]
        if not stale:
            return
        pick = min(stale, key=lambda p: (children.pod_ready(p), p["metadata"]["name"]))
        if children.pod_ready(pick) and not all(
            children.pod_ready(p) for p in live if p is not pick
        ):
            return  # another pod is not serving: replacing this one now would leave less
        name = pick["metadata"]["name"]
        await self.kube.delete(path("v1", "pods", group.metadata.namespace, name))
        events.append(("Replaced", f"pod {name}: its template changed; it drains and returns"))
        live.remove(pick)

    async def _views(
        self, ns: str, pool_name: str, group_pods: set[str]
    ) -> tuple[list[scale_in.ScaleInView], list[scale_in.ScaleInView], set[int]]:
        """Every worker of the pool as scale-in sees it, from its own state (version,
        residents), split into this group's and the others; and the versions with
        unfinished work. A pod that is not Ready or does not answer is not ready: it
        holds nothing the loop can reach, and goes first."""
        pool_obj = await self.kube.get(self._pool_url(ns, pool_name))
        token = None
        if pool_obj is not None:
            token = await self._token(ns, pool_obj["spec"].get("tokenSecret", "cadence-token"))
        pods = await self.kube.list(path("v1", "pods", ns), children.worker_selector(pool_name))
        views: list[scale_in.ScaleInView] = []
        others: list[scale_in.ScaleInView] = []
        unfinished: set[int] = set()
        for pod in pods:
            name, url = pod["metadata"]["name"], self.endpoint(pod)
            view = scale_in.ScaleInView(name, None, 0, 0, ready=False)
            if url is not None and token:
                client = WorkerClient(url, token, timeout_s=5.0, transport=self.transport)
                try:
                    st = await client.state()
                except (WorkerError, httpx.TransportError):
                    pass
                else:
                    unfinished |= {r.version for r in st.residents}
                    unfinished |= {p.version for p in st.parked}
                    used = sum(r.context for r in st.residents)
                    view = scale_in.ScaleInView(
                        name, st.version, used, len(st.residents), ready=children.pod_ready(pod)
                    )
                finally:
                    await client.aclose()
            (views if name in group_pods else others).append(view)
        return views, others, unfinished
