"""The operator's reconcilers and their kopf handlers.

Each reconciler reads one resource, validates it with the same pydantic model `cadence
run` uses, makes what it owns exist (`children.py` says what) and returns the status to
write. An invalid resource is not an error to retry: it gets `Degraded` with the field
and the reason, and an Event, and nothing else happens to it or to any other resource.

- RolloutPool: its RolloutGroups (created once; afterwards each group's `replicas` is
  the one owner of its size), the workers' headless Service, the token Secret.
- RolloutGroup: worker pods up to `spec.replicas` while its pool serves a run (a pod
  needs the run's model); above it, pods chosen by `children.choose_for_scale_in` are
  deleted, and their SIGTERM drains them. Status: replicas, ready, the selector /scale
  reports.
- TrainingRun: checks its pool can hold its longest trajectory (`capacity.py`), binds
  the pool (one run per pool; a second waits with a condition saying why), and makes the
  trainer's ConfigMap, StatefulSet and Service. A finished or deleted run releases the
  pool; the groups then retire its workers, and a waiting run binds.

Each TrainingRun's control loop (`loop.py`) runs on the pool's pods, started and stopped
by the supervisor (`supervisor.py`, which also reconciles every object again each resync
period, with no finalizer on any object), and reports it (`run_report.py`): statuses,
Events, the operator's metrics (`metrics.py`).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import kopf
from pydantic import BaseModel, ValidationError

from cadence.common.complaints import first_complaint
from cadence.common.errors import describe
from cadence.operator.api.capacity import check_pair
from cadence.operator.api.resources import (
    API_VERSION,
    GROUP,
    VERSION,
    ResourceError,
    RolloutGroup,
    RolloutPool,
    TrainingRun,
    as_written,
)
from cadence.operator.api.settings import budgets_of, knobs_of
from cadence.operator.control.loop import ControlLoop, LoopConfig
from cadence.operator.kube import children
from cadence.operator.kube.client import KubeApi, KubeError, path, path_of
from cadence.operator.kube.events import EventRecorder, Post
from cadence.operator.kube.metrics import OperatorMetrics
from cadence.operator.kube.run_report import RunReporter
from cadence.operator.kube.supervisor import Stopped, Supervisor
from cadence.scheduler.registry import POLICIES
from cadence.trainer.client import TrainerClient, TrainerError
from cadence.worker.client import WorkerClient, WorkerError

log = logging.getLogger("cadence.operator")

Status = dict[str, Any]
Events = list[tuple[str, str]]  # (reason, message) for the handler to publish
# Reasons that announce a state: once per entry into it.
STATES = {"Waiting", "Invalid", "ReconcileError"}
WARNINGS = {"Invalid", "ReconcileError"}


def pod_endpoint(pod: Mapping[str, Any]) -> str | None:
    """A worker pod's control URL: its IP over HTTP, its Service name over TLS."""
    return children.pod_url(pod)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, true: bool, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if true else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": _now(),
    }


def settled(
    before: Sequence[Mapping[str, Any]],
    after: list[dict[str, Any]],
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """`after`, each condition keeping its earlier lastTransitionTime where its status
    did not change (the time says when it became so, not when it was last checked), and
    saying which generation of the spec it was observed on."""
    old = {c.get("type"): c for c in before}
    out = []
    for new in after:
        prev = old.get(new["type"]) or {}
        kept = prev.get("status") == new["status"] and "lastTransitionTime" in prev
        c = {**new, "lastTransitionTime": prev["lastTransitionTime"]} if kept else dict(new)
        if generation is not None:
            c["observedGeneration"] = generation
        out.append(c)
    return out


class Invalid(Exception):
    """A resource its model refuses; the message names the field and the reason."""


def validated(model: type[BaseModel], body: Mapping[str, Any]) -> Any:
    obj = as_written(body)
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        where, message = first_complaint(e, obj, model)
        raise Invalid(f"{where}: {message}" if where else message) from None


def _waiting(
    body: Mapping[str, Any], reason: str, message: str, events: Events, *, stuck: bool
) -> Status:
    """A run that cannot start: Degraded when only a change of the cluster can let it
    (its pool is missing), not when it waits its turn (its pool serves another run)."""
    events.append(("Waiting", message))
    return {
        "phase": "Waiting",
        "conditions": [
            condition("Ready", False, reason, message),
            condition("Progressing", False, reason, message),
            condition("Degraded", stuck, reason if stuck else "Valid", message),
        ],
    }


# What a run's loop writes into each of its groups' status (`run_report.py`).
RUN_FIGURES = ("versions", "meanContext", "headroomTokens", "pendingTrajectories", "pendingTokens")


def _pool_conditions(ready: int, desired: int, *, serving: bool) -> list[dict[str, Any]]:
    """Ready and Progressing of a pool. Its workers run only while it serves a run: an
    idle pool is said to be idle, not to be scaling towards workers it will not start."""
    if not serving:
        said = "no TrainingRun is bound; the workers start with one"
        return [
            condition("Ready", False, "Idle", said),
            condition("Progressing", False, "Idle", said),
        ]
    said = f"{ready} of {desired} workers ready"
    return [
        condition("Ready", ready == desired and desired > 0, "Workers", said),
        condition(
            "Progressing", ready != desired, "Scaling" if ready != desired else "Settled", said
        ),
    ]


@dataclass
class Reconciler:
    kube: KubeApi
    endpoint: Callable[[Mapping[str, Any]], str | None] = pod_endpoint
    trainer_endpoint: Callable[[TrainingRun, RolloutPool | None], str] = children.trainer_url
    status_every_s: float = 2.0  # a run's status is patched at most this often
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    # How clients reach workers and trainers (tests route them in-process; None: network).
    transport: httpx.AsyncBaseTransport | None = None
    # Handler runs that finished (an invalid object's too; not one that raised), per
    # (plural, namespace, name), whatever started them (a change, the resync): how a test
    # knows an object has been reconciled again since it last looked.
    reconciles: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    post: Post = field(init=False)  # Events about its objects
    # The runs whose control loop is running now (waiting for its pool or trainer too).
    controlling: set[tuple[str, str]] = field(default_factory=set)
    # Why a run's control loop could not start, as last logged (logged again on a change).
    waiting: dict[tuple[str, str], str] = field(default_factory=dict)
    # Whose calls the workers' NetworkPolicy admits: the operator's pods (this namespace)
    # and Prometheus (that one).
    operator_namespace: str = "cadence-system"
    scrapers_namespace: str = "monitoring"

    def __post_init__(self) -> None:
        self.post = EventRecorder(self.kube)

    async def aclose(self) -> None:
        if isinstance(self.post, EventRecorder):
            await self.post.drain()

    async def _ensure_spec(self, obj: Mapping[str, Any]) -> None:
        """Create `obj`, or bring an existing one's spec to `obj`'s: for objects only the
        operator writes, whose spec follows the pool (a group turned to vLLM opens KV
        ports)."""
        existing, created = await self.kube.ensure(obj)
        if not created and existing.get("spec") != obj["spec"]:
            await self.kube.patch(path_of(obj), {"spec": obj["spec"]})

    def _pool_url(self, namespace: str, name: str | None = None) -> str:
        return path(API_VERSION, "rolloutpools", namespace, name)

    async def pool(self, body: Mapping[str, Any], events: Events) -> Status:
        pool: RolloutPool = validated(RolloutPool, body)
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
                *_pool_conditions(ready, desired, serving=run_obj is not None),
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
            index = 0
            while len(live) < desired:
                name = f"{group.metadata.name}-{index}"
                if name not in taken:
                    pod, _ = await self.kube.ensure(
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
            for name in children.choose_for_scale_in(
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
                _pool_conditions(ready, desired, serving=run_obj is not None)[0],
                condition("Degraded", False, "Valid", "the spec is valid"),
            ],
        }
        if run_obj is None:  # what a run's loop reported of the group ended with the run
            status.update(dict.fromkeys(RUN_FIGURES))
        return status

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

    async def _release(self, ns: str, pool_name: str, events: Events) -> None:
        await self.kube.patch(self._pool_url(ns, pool_name) + "/status", {"status": {"run": None}})
        events.append(("Released", f"RolloutPool {pool_name}"))

    async def _token(self, ns: str, secret_name: str) -> str | None:
        """The pool's bearer token, from the Secret the pool's handler made."""
        secret = await self.kube.get(path("v1", "secrets", ns, secret_name))
        if secret is None:
            return None
        encoded = (secret.get("data") or {}).get(children.TOKEN_KEY)
        try:
            token = base64.b64decode(encoded, validate=True).decode() if encoded else ""
        except (ValueError, UnicodeDecodeError):
            token = ""
        if not token.strip():
            raise Invalid(
                f"Secret {secret_name} holds no bearer token under the key "
                f"{children.TOKEN_KEY!r}: add one, or delete the Secret for the operator to "
                "make it"
            )
        return token

    async def _views(
        self, ns: str, pool_name: str, group_pods: set[str]
    ) -> tuple[list[children.WorkerView], list[children.WorkerView], set[int]]:
        """Every worker of the pool as scale-in sees it, from its own state (version,
        residents), split into this group's and the others; and the versions with
        unfinished work. A pod that is not Ready or does not answer is not ready: it
        holds nothing the loop can reach, and goes first."""
        pool_obj = await self.kube.get(self._pool_url(ns, pool_name))
        token = None
        if pool_obj is not None:
            token = await self._token(ns, pool_obj["spec"].get("tokenSecret", "cadence-token"))
        pods = await self.kube.list(path("v1", "pods", ns), children.worker_selector(pool_name))
        views: list[children.WorkerView] = []
        others: list[children.WorkerView] = []
        unfinished: set[int] = set()
        for pod in pods:
            name, url = pod["metadata"]["name"], self.endpoint(pod)
            view = children.WorkerView(name, None, 0, 0, ready=False)
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
                    view = children.WorkerView(
                        name, st.version, used, len(st.residents), ready=children.pod_ready(pod)
                    )
                finally:
                    await client.aclose()
            (views if name in group_pods else others).append(view)
        return views, others, unfinished

    async def run(self, body: Mapping[str, Any], events: Events) -> Status:
        run: TrainingRun = validated(TrainingRun, body)
        ns, name = run.metadata.namespace, run.metadata.name
        # kopf's body is live and changes under this handler (its loop writing
        # Succeeded): decide on the phase it was called with, read once.
        phase = (body.get("status") or {}).get("phase")
        pool_obj = await self.kube.get(self._pool_url(ns, run.spec.pool))
        bound = ((pool_obj or {}).get("status") or {}).get("run")
        if phase == "Succeeded":
            # Finished (its control loop wrote the last status): the pool's workers go,
            # and the pool may serve the next run.
            if bound == name:
                await self._release(ns, run.spec.pool, events)
            if await self._complete(run, body, events):
                return {}
            said = "the run finished; its workers are released"
            return {
                "conditions": [
                    condition("Ready", False, "Succeeded", said),
                    condition("Progressing", False, "Succeeded", said),
                    condition("Degraded", False, "Valid", "the spec is valid"),
                ]
            }
        if pool_obj is None:
            message = f"no RolloutPool {run.spec.pool}"
            return _waiting(body, "PoolMissing", message, events, stuck=True)
        pool: RolloutPool = validated(RolloutPool, pool_obj)
        try:
            check_pair(pool, run)
        except ResourceError as e:
            raise Invalid(str(e).removeprefix("TrainingRun ")) from None
        if bound and bound != name:
            message = f"RolloutPool {run.spec.pool} serves TrainingRun {bound}; one at a time"
            return _waiting(body, "PoolBusy", message, events, stuck=False)
        if bound != name:
            # Bound only if the pool is as it was read: two runs created at once both saw
            # it free, and the second write must fail, not take the pool from the first.
            version = pool_obj["metadata"].get("resourceVersion")
            claim: dict[str, Any] = {"status": {"run": name}}
            if version is not None:
                claim["metadata"] = {"resourceVersion": version}
            try:
                await self.kube.patch(self._pool_url(ns, run.spec.pool) + "/status", claim)
            except KubeError as e:
                if e.status != 409:
                    raise
                message = f"RolloutPool {run.spec.pool} changed as this run bound it; trying again"
                return _waiting(body, "PoolBusy", message, events, stuck=False)
            events.append(("Bound", f"RolloutPool {run.spec.pool}"))
        for obj in children.trainer_objects(run, body, pool):
            await self.kube.ensure(obj)
        missing = await self._not_serving(run, pool)
        serving = not missing
        said = "the trainer answers and every group has a ready worker"
        status: Status = {
            "conditions": [
                condition("Ready", serving, "Serving" if serving else "Starting", missing or said),
                condition(
                    "Progressing",
                    not serving,
                    "Starting" if not serving else "Serving",
                    missing or said,
                ),
                condition("Degraded", False, "Valid", "the spec is valid"),
            ],
        }
        # Starting until its control loop runs; once Running, the phase is the loop's to
        # write: this handler may have read the run just before the loop wrote
        # Succeeded, and must not undo it.
        if phase not in ("Running", "Starting"):
            status["phase"] = "Starting"
        return status

    async def _complete(self, run: TrainingRun, body: Mapping[str, Any], events: Events) -> bool:
        """A finished run's completion policy: its trainer stopped (its state and Service
        kept), the run deleted once its time to live after finishing has passed. True
        when the run was deleted."""
        ns, policy = run.metadata.namespace, run.spec.completion
        if policy.stop_trainer:
            url = path("apps/v1", "statefulsets", ns, children.trainer_name(run))
            trainer = await self.kube.get(url)
            if trainer is not None and trainer["spec"].get("replicas", 1) != 0:
                await self.kube.patch(url, {"spec": {"replicas": 0}})
                events.append(("TrainerStopped", f"{children.trainer_name(run)}: the run finished"))
        finished = (body.get("status") or {}).get("completionTime")
        ttl = policy.ttl_seconds_after_finished
        if ttl is None or not finished:
            return False
        at = datetime.datetime.strptime(finished, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
        if datetime.datetime.now(datetime.UTC) < at + datetime.timedelta(seconds=ttl):
            return False
        await self.kube.delete(path(API_VERSION, "trainingruns", ns, run.metadata.name))
        log.info("TrainingRun %s/%s deleted %d s after it finished", ns, run.metadata.name, ttl)
        return True

    async def _not_serving(self, run: TrainingRun, pool: RolloutPool) -> str:
        """What keeps `run` from being served, in a sentence; empty when its trainer
        answers and every group of its pool has a ready worker."""
        ns = run.metadata.namespace
        missing = []
        groups = await self.kube.list(
            path(API_VERSION, "rolloutgroups", ns), {"cadence.dev/pool": pool.metadata.name}
        )
        for g in sorted(groups, key=lambda g: str(g["spec"]["group"])):
            st = g.get("status") or {}
            if st.get("readyReplicas", 0) < 1:
                pods = await self.kube.list(
                    path("v1", "pods", ns),
                    {
                        "cadence.dev/pool": pool.metadata.name,
                        "cadence.dev/group": g["spec"]["group"],
                    },
                )
                crashed = next(filter(None, map(children.crash_said, pods)), None)
                why = f": {crashed}" if crashed else ""
                missing.append(f"group {g['spec']['group']} has no ready worker{why}")
        token = await self._token(ns, pool.spec.token_secret)
        answered = False
        if token is not None:
            client = TrainerClient(
                self.trainer_endpoint(run, pool), token, timeout_s=2.0, transport=self.transport
            )
            try:
                await client.stats()
                answered = True
            except (TrainerError, OSError, httpx.HTTPError):
                pass
            finally:
                await client.aclose()
        if not answered:
            pod = await self.kube.get(path("v1", "pods", ns, f"{children.trainer_name(run)}-0"))
            crashed = children.crash_said(pod) if pod is not None else None
            said = (
                f"the trainer does not answer: {crashed}"
                if crashed
                else "the trainer does not answer yet"
            )
            missing.insert(0, said)
        return "; ".join(missing)

    async def control(self, body: Mapping[str, Any], stopped: Stopped) -> None:
        """The shared control loop for one TrainingRun, for as long as it is bound and
        unfinished: workers are the pool's pods (their endpoints), the trainer is the
        run's Service; the run's status is patched from the loop and the trainer's
        stats at a bounded rate. A restarted operator starts a new loop, which rebuilds
        its view from the workers and the ledger."""
        try:
            run: TrainingRun = validated(TrainingRun, body)
        except Invalid:
            return  # the change handlers report it
        if (body.get("status") or {}).get("phase") == "Succeeded":
            return  # finished before this operator started
        ns, name = run.metadata.namespace, run.metadata.name
        self.controlling.add((ns, name))
        try:
            await self._control(run, body, stopped)
        finally:
            self.controlling.discard((ns, name))

    async def _control(self, run: TrainingRun, body: Mapping[str, Any], stopped: Stopped) -> None:
        ns, name = run.metadata.namespace, run.metadata.name
        while not stopped:
            pool_obj = await self.kube.get(self._pool_url(ns, run.spec.pool))
            if ((pool_obj or {}).get("status") or {}).get("run") == name:
                break
            await asyncio.sleep(1.0)  # stopped is checked each turn
        if stopped or pool_obj is None:
            return
        pool: RolloutPool = validated(RolloutPool, pool_obj)
        try:
            token = await self._token(ns, pool.spec.token_secret)
        except Invalid as e:
            # Said once per reason: the supervisor tries again every few seconds.
            if self.waiting.get((ns, name)) != str(e):
                self.waiting[(ns, name)] = str(e)
                log.warning("run %s/%s waits: %s", ns, name, e)
            return  # the run's status says why; the supervisor starts the loop again
        self.waiting.pop((ns, name), None)
        if token is None:
            return  # the pool's handler makes it; the supervisor starts the loop again
        client = TrainerClient(
            self.trainer_endpoint(run, pool), token, timeout_s=5.0, transport=self.transport
        )
        while not stopped:  # the trainer's pod may still be starting
            try:
                await client.stats()
                break
            except (TrainerError, OSError, httpx.HTTPError):
                await asyncio.sleep(2.0)  # stopped is checked each turn
        if stopped:
            await client.aclose()
            return
        s = run.spec.scheduler
        loop = ControlLoop(
            POLICIES[s.policy](),
            LoopConfig(
                knobs=knobs_of(run),
                period_s=s.control_period_s,
                max_tool_calls=run.spec.multi_turn.max_tool_calls,
                budgets=budgets_of(run),
            ),
            client,
            {},
            token,
        )
        reporter = RunReporter(
            self.kube, self.endpoint, self.status_every_s, run, pool, body, loop, client, self.post
        )
        self.metrics.runs[(ns, name)] = reporter.series

        async def done() -> bool:
            return bool(stopped) or await reporter.done()

        try:
            await loop.run(done)
        finally:
            self.metrics.runs.pop((ns, name), None)
            await loop.aclose()
            await client.aclose()


@dataclass
class Handling:
    """What wraps each reconciler for kopf: its status written with conditions that keep
    their transition times, an invalid object or a failed reconcile said as `Degraded`
    with an Event (once per entry into that state) and a log line, never retried in
    silence; one run per object at a time."""

    reconciler: Reconciler
    post: Post | None = None  # the reconciler's recorder unless a test gives its own
    # A state an object is in (waiting, invalid, failing) is announced when it enters it,
    # not on every retry of its handlers: the last one announced per object.
    said: dict[tuple[str, str, str], tuple[str, str]] = field(default_factory=dict)
    # The resync runs beside kopf's change handlers, not after them: two runs of one
    # object's reconciler at once would both act on what they saw (a group scaled in by
    # its update handler and its resync lost two pods, not one). One at a time.
    busy: defaultdict[tuple[str, str, str], asyncio.Lock] = field(
        default_factory=lambda: defaultdict(asyncio.Lock)
    )
    calls: dict[str, Callable[[Mapping[str, Any], Events], Any]] = field(default_factory=dict)

    def forget(self, key: tuple[str, str, str]) -> None:
        """A deleted object's lock and last announced state go with it."""
        lock = self.busy.get(key)
        if lock is not None and not lock.locked():
            del self.busy[key]
        self.said.pop(key, None)
        self.reconciler.reconciles.pop(key, None)

    async def reconcile_one(
        self, key: tuple[str, str, str], body: Mapping[str, Any], patch: kopf.Patch
    ) -> None:
        """`key`'s reconciler, as the supervisor's resync calls it."""
        async with self.busy[key]:
            await self.reconcile(key, self.calls[key[0]], body, patch)

    def handler(
        self, kind: str, call: Callable[[Mapping[str, Any], Events], Any]
    ) -> Callable[..., Any]:
        async def handler(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
            key = (kind, body["metadata"].get("namespace", ""), body["metadata"]["name"])
            async with self.busy[key]:
                await self.reconcile(key, call, body, patch)

        return handler

    async def reconcile(
        self,
        key: tuple[str, str, str],
        call: Callable[[Mapping[str, Any], Events], Any],
        body: Mapping[str, Any],
        patch: kopf.Patch,
    ) -> None:
        kind = key[0]
        events: Events = []
        before = (body.get("status") or {}).get("conditions") or []
        generation = body["metadata"].get("generation")
        try:
            status = await call(body, events)
        except Invalid as e:
            patch.status["conditions"] = settled(
                before,
                [
                    condition("Degraded", True, "Invalid", str(e)),
                    condition("Ready", False, "Invalid", str(e)),
                ],
                generation,
            )
            if kind == "trainingruns":
                patch.status["phase"] = "Degraded"
            events = [("Invalid", str(e))]
        except Exception as e:
            # Anything else (the API refused a write, a bug): said on the object and in
            # the log, not retried silently by kopf; the resync tries again.
            log.exception("reconciling %s %s/%s failed", kind, key[1], key[2])
            said = f"reconciling failed, retried every resync: {describe(e)}"
            patch.status["conditions"] = settled(
                before,
                [
                    condition("Degraded", True, "ReconcileError", said),
                    condition("Ready", False, "ReconcileError", said),
                ],
                generation,
            )
            events = [("ReconcileError", said)]
        else:
            if "conditions" in status:
                status["conditions"] = settled(before, status["conditions"], generation)
            patch.status.update(status)
        for reason, message in events:
            if reason in STATES:
                if self.said.get(key) == (reason, message):
                    continue
                self.said[key] = (reason, message)
            (self.post or self.reconciler.post)(body, reason, message, reason in WARNINGS)
            log.info("%s %s/%s: %s: %s", kind, key[1], key[2], reason, message)
        if not any(reason in STATES for reason, _ in events):
            self.said.pop(key, None)
        self.reconciler.reconciles[key] += 1


def register(
    registry: kopf.OperatorRegistry, reconciler: Reconciler, *, resync_s: float = 5.0
) -> Supervisor:
    """The kopf handlers, on `registry` (tests pass a fresh one): each change reconciles
    its object at once; every event reaches the supervisor, which reconciles every object
    again each `resync_s` seconds (what notices changes no handler is called for:
    a pool released, a run deleted, a pod gone) and runs each run's control loop. None of
    them needs kopf's finalizer, so none is put on Cadence's objects (and one an earlier
    version put is taken off by kopf at the next event)."""
    handling = Handling(reconciler)
    supervisor = Supervisor(
        reconciler.kube,
        handling.reconcile_one,
        reconciler.control,
        handling.forget,
        interval_s=resync_s,
    )

    for plural, call in (
        ("rolloutpools", reconciler.pool),
        ("rolloutgroups", reconciler.group),
        ("trainingruns", reconciler.run),
    ):
        handling.calls[plural] = call
        handler = handling.handler(plural, call)
        resource = (GROUP, VERSION, plural)
        kopf.on.resume(*resource, id=f"{plural}-resume", registry=registry)(handler)
        kopf.on.create(*resource, id=f"{plural}-create", registry=registry)(handler)
        kopf.on.update(*resource, id=f"{plural}-update", field="spec", registry=registry)(handler)
        kopf.on.event(*resource, id=f"{plural}-seen", registry=registry)(_seen(supervisor, plural))

    async def start(**_: Any) -> None:
        supervisor.start()

    async def stop(**_: Any) -> None:
        await supervisor.aclose()
        await reconciler.aclose()

    kopf.on.startup(id="supervisor", registry=registry)(start)
    kopf.on.cleanup(id="supervisor", registry=registry)(stop)
    return supervisor


def _seen(supervisor: Supervisor, plural: str) -> Callable[..., Any]:
    async def seen(body: kopf.Body, type: str | None, **_: Any) -> None:  # in the loop
        supervisor.saw(plural, type, body)

    return seen
