"""What a TrainingRun's control loop reports, from the operator's task for that run:
the pool's pods join the loop when Ready and leave it when gone; each RolloutGroup's status and the
operator's metrics carry the last plan's per-group demand; the run's status carries the
trainer's stats; Events say when the phase changes, trajectories depart, actions fail,
workers are lost, or a pinned floor is below a worker's growth."""

from __future__ import annotations

import datetime
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import ValidationError

from cadence.common.clock import loop_time
from cadence.operator.api.capacity import group_capacities, hourly_price
from cadence.operator.api.resources import API_VERSION, RolloutPool, TrainingRun, as_written
from cadence.operator.control.group_stats import group_stats
from cadence.operator.control.loop import ControlLoop
from cadence.operator.kube import children
from cadence.operator.kube.autoscaler import Autoscaler, Seen
from cadence.operator.kube.client import KubeApi, KubeError, path
from cadence.operator.kube.events import Post
from cadence.operator.kube.metrics import RunSeries
from cadence.scheduler.autoscale import GroupShape
from cadence.trainer.client import TrainerClient, TrainerError

log = logging.getLogger("cadence.operator")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


Status = dict[str, Any]


@dataclass
class RunReporter:
    """What a run's control loop reports, at most every `status_every_s`: the pool's
    pods join the loop; each RolloutGroup's status (versions, mean context, headroom,
    waiting demand) and the operator's metrics; the run's status from the trainer's
    stats; Events for a phase change, concentration departures, failed actions and lost
    workers."""

    kube: KubeApi
    endpoint: Callable[[Mapping[str, Any]], str | None]  # a pod's worker URL, once it has one
    status_every_s: float
    run: TrainingRun
    pool: RolloutPool
    body: Mapping[str, Any]  # the run as the watch last saw it
    loop: ControlLoop
    trainer: TrainerClient
    post: Post
    series: RunSeries = field(init=False)
    clock: Callable[[], float] = loop_time  # seconds; a test's fake clock
    started: float | None = None  # on `clock`; None: when made
    patched: float | None = None  # when the status was last written
    seen: Counter[str] = field(default_factory=Counter)  # loop totals at the last report
    reported_lost: frozenset[str] = frozenset()
    reported_floor: set[str] = field(default_factory=set)  # workers warned of a thin hMin
    written: dict[str, Status] = field(default_factory=dict)  # each group's last status
    uids: dict[str, str] = field(default_factory=dict)  # each member pod's UID
    dollars: float = 0.0  # what the pool's pods have cost so far
    costed: float | None = None  # when `dollars` was last brought up to date

    def __post_init__(self) -> None:
        if self.started is None:
            self.started = self.clock()
        self.series = RunSeries(pool=self.pool.metadata.name, loop=self.loop)
        self.autoscaler = Autoscaler(self.kube, self.post, self.clock)
        self.phase = (self.body.get("status") or {}).get("phase")
        self._shape(self.pool)

    def _shape(self, pool: RolloutPool) -> None:
        capacities = group_capacities(pool, self.run)
        self.shapes = {
            f"{pool.metadata.name}-{g.name}": (g.affinity, capacities[g.name])
            for g in pool.spec.groups
        }
        self.prices = {g.name: hourly_price(g) for g in pool.spec.groups}
        self.pool = pool

    def _follow(self, pool_obj: Mapping[str, Any]) -> None:
        """The groups reported and priced follow the pool's spec: one added mid-run is
        reported from its first workers on, one removed stops being reported. A spec the
        pool's handler refuses leaves them as they were (that handler says why)."""
        try:
            pool = RolloutPool.model_validate(as_written(pool_obj))
            if pool.spec.groups != self.pool.spec.groups:
                self._shape(pool)
        except (ValidationError, ValueError, KeyError) as e:
            log.debug("run %s keeps its pool's groups: %s", self.run.metadata.name, e)

    async def done(self) -> bool:
        now = self.clock()
        if self.patched is not None and now - self.patched < self.status_every_s:
            return False
        self.patched = now
        kube, ns = self.kube, self.run.metadata.namespace
        try:
            pool = await kube.get(path(API_VERSION, "rolloutpools", ns, self.pool.metadata.name))
            pods = await kube.list(
                path("v1", "pods", ns), children.worker_selector(self.pool.metadata.name)
            )
        except (KubeError, httpx.TransportError) as e:
            log.warning("listing %s's pods failed; retried next cycle: %s", self.run.spec.pool, e)
            return False
        if ((pool or {}).get("status") or {}).get("run") != self.run.metadata.name:
            # The pool was deleted or released: this loop ends (its run's handler says
            # why on the run), rather than report a run Running on workers it lost.
            log.info("run %s/%s: its pool is gone; its loop ends", ns, self.run.metadata.name)
            return True
        self._members(pods)
        self._follow(pool or {})
        await self._groups(pods, pool or {})
        self._events()
        try:
            stats = await self.trainer.stats()
        except (TrainerError, OSError, httpx.TransportError):
            return False
        wall = max(self.clock() - (self.started or 0.0), 1e-9)
        hourly = sum(
            self.prices.get(p["metadata"]["labels"].get("cadence.dev/group", ""), 0.0) for p in pods
        )
        # The pool's cost as it was between reports: an autoscaled pool changes size.
        self.dollars += hourly * (now - (self.costed or self.started or now)) / 3600
        self.costed = now
        dollars = self.dollars
        # Running once a worker has joined; before, its trainer answers but nothing runs.
        phase = "Succeeded" if stats.done else "Running" if self.loop.workers else "Starting"
        self.series.version = stats.version
        self.series.tokens_per_second = round(stats.tokens_delivered / wall, 1)
        await kube.patch(
            path(API_VERSION, "trainingruns", ns, self.run.metadata.name) + "/status",
            {
                "status": {
                    "phase": phase,
                    "policyVersion": stats.version,
                    "step": stats.consumed,
                    "tokensPerSecond": self.series.tokens_per_second,
                    "latencyP50S": round(stats.latency_p50_s, 3),
                    "latencyP95S": round(stats.latency_p95_s, 3),
                    "tokensPerDollar": round(stats.tokens_delivered / dollars, 1)
                    if dollars > 0
                    else 0.0,
                    "warnings": sorted(set(self.loop.floor_warnings.values())),
                    **({"completionTime": _now()} if stats.done else {}),
                }
            },
        )
        if phase != self.phase:
            message = f"policy version {stats.version}, {stats.consumed} batches trained"
            self.post(self.body, phase, message, False)
            self.phase = phase
        return stats.done

    def _members(self, pods: list[dict[str, Any]]) -> None:
        """The loop's workers follow the pool's pods. A pod joins once it is Ready (its
        engine loaded and serving: polled before, a loading worker was taken for lost);
        one recreated under its name (another UID or address) joins afresh; one whose pod
        is gone leaves, and what it held is re-queued. A pod that exists but stopped
        answering stays: the loop takes it for lost and asks it again."""
        present = {p["metadata"]["name"] for p in pods}
        joined = {}
        for pod in pods:
            meta = pod["metadata"]
            url = self.endpoint(pod)
            if url is None or meta.get("deletionTimestamp") or not children.pod_ready(pod):
                continue
            name, uid = meta["name"], meta.get("uid", "")
            if self.loop.workers.get(name) != url or self.uids.get(name) != uid:
                joined[name], self.uids[name] = url, uid
        gone = [w for w in self.loop.workers if w not in present]
        if gone:
            log.info("workers %s left the pool (their pods are gone)", ", ".join(sorted(gone)))
            self.loop.remove_workers(gone)
            for name in gone:
                self.uids.pop(name, None)
        if joined:
            log.info("workers %s join the loop", ", ".join(sorted(joined)))
            self.loop.add_workers(joined)

    async def _groups(self, pods: list[dict[str, Any]], pool_obj: Mapping[str, Any]) -> None:
        """Each RolloutGroup's share of the last cycle, into its status and the metrics;
        only the groups the pool has now (a removed group's series go); and the pool's
        autoscaler's turn, where it has one."""
        if self.loop.last_plan is None:
            return
        snapshot, actions = self.loop.last_plan
        pool_name = self.pool.metadata.name
        group_of = {
            p["metadata"]["name"]: f"{pool_name}-{p['metadata']['labels'].get('cadence.dev/group')}"
            for p in pods
        }
        shapes = []
        for name, (affinity, capacity) in self.shapes.items():
            # A live worker's own capacity, else the catalog's (a group scaled to zero).
            live = [w.capacity for w in snapshot.workers if group_of.get(w.id) == name]
            shapes.append(GroupShape(name, affinity, max(live, default=capacity)))
        self.series.groups = group_stats(snapshot, actions, shapes, group_of)
        if self.pool.spec.autoscaling.enabled:
            waiting = {
                name: (st.pending_trajectories, st.pending_tokens)
                for name, st in self.series.groups.items()
            }
            seen = Seen((snapshot, actions), shapes, group_of, self.loop.decoded, waiting)
            await self.autoscaler.step(self.pool, pool_obj, seen)
            self.series.desired = dict(self.autoscaler.desired)
        for name, st in self.series.groups.items():
            status: Status = {
                "versions": list(st.versions),
                "meanContext": st.mean_context,
                "headroomTokens": st.headroom_tokens,
                "pendingTrajectories": st.pending_trajectories,
                "pendingTokens": st.pending_tokens,
            }
            if self.written.get(name) == status:
                continue  # unchanged: no write, no watch event for every watcher
            url = path(API_VERSION, "rolloutgroups", self.run.metadata.namespace, name)
            try:
                await self.kube.patch(url + "/status", {"status": status})
            except (KubeError, httpx.TransportError) as e:
                log.warning("patching %s's status failed: %s", name, e)
                continue
            self.written[name] = status

    def _events(self) -> None:
        totals = self.loop.totals
        body = self.body
        departed = totals["departures"] - self.seen["departures"]
        if departed:
            message = f"{departed} trajectories departed their concentration sources"
            self.post(body, "Departed", message, False)
        failed = totals["errors"] - self.seen["errors"]
        if failed:
            message = f"{failed} worker actions failed (the operator's log says which)"
            self.post(body, "ActionsFailed", message, True)
        for wid, said in self.loop.floor_warnings.items():
            if wid not in self.reported_floor:
                self.post(body, "FloorBelowGrowth", said, True)
                self.reported_floor.add(wid)
        lost = self.loop.lost - self.reported_lost
        if lost:
            message = f"silent, their samples re-queued: {', '.join(sorted(lost))}"
            self.post(body, "WorkersLost", message, True)
        back = self.reported_lost - self.loop.lost
        if back:
            message = f"answering again, rejoined the pool: {', '.join(sorted(back))}"
            self.post(body, "WorkersRejoined", message, False)
        self.seen, self.reported_lost = totals, self.loop.lost
