"""The TrainingRun reconciler and its control loop: a run checks its pool can hold its
longest trajectory (`capacity.py`), binds the pool (one run per pool; a second waits with
a condition saying why) and gets its trainer (ConfigMap, StatefulSet, Service). While it
is bound and unfinished its control loop (`control/loop.py`) runs on the pool's pods,
started and stopped by the supervisor and reported by `run_report.py`. A finished run
releases its pool and stops its trainer (its completion policy)."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from cadence.common.errors import describe
from cadence.common.trace import Summary, unused_path
from cadence.operator.api.capacity import check_pair
from cadence.operator.api.resources import (
    API_VERSION,
    ResourceError,
    RolloutPool,
    TrainingRun,
)
from cadence.operator.api.settings import budgets_of, knobs_of
from cadence.operator.api.simulate import trace_header
from cadence.operator.control.config import LoopConfig
from cadence.operator.control.loop import ControlLoop
from cadence.operator.control.trace import TraceRecorder
from cadence.operator.kube import children, trainer_objects
from cadence.operator.kube.client import KubeError, path
from cadence.operator.kube.reconciling import (
    Events,
    Invalid,
    ReconcilerBase,
    Status,
    condition,
    validated,
    waiting_status,
)
from cadence.operator.kube.run_report import RunReporter
from cadence.operator.kube.supervisor import Stopped
from cadence.scheduler.registry import POLICIES
from cadence.trainer.client import TrainerClient, TrainerError

log = logging.getLogger("cadence.operator")


async def _finish_trace(
    recorder: TraceRecorder, client: TrainerClient, loop: ControlLoop, wall_s: float
) -> None:
    """The last deliveries and the run's figures, where the trainer still answers."""
    summary = None
    try:
        await recorder.read_trainer(now=True)
        stats = await client.stats()
        advances = loop.advance_seconds
        summary = Summary(
            wall_seconds=wall_s,
            throughput_tok_s=stats.tokens_delivered / wall_s if wall_s > 0 else 0.0,
            latency_p95_s=stats.latency_p95_s,
            advance_seconds=sum(advances) / len(advances) if advances else None,
        )
    except (TrainerError, OSError, httpx.HTTPError) as e:
        log.warning("trace %s ends without a summary: %s", recorder.path, describe(e))
    recorder.close(summary)


class RunReconciler(ReconcilerBase):
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
            return waiting_status(body, "PoolMissing", message, events, stuck=True)
        pool: RolloutPool = validated(RolloutPool, pool_obj)
        try:
            check_pair(pool, run)
        except ResourceError as e:
            raise Invalid(str(e).removeprefix("TrainingRun ")) from None
        if bound and bound != name:
            message = f"RolloutPool {run.spec.pool} serves TrainingRun {bound}; one at a time"
            return waiting_status(body, "PoolBusy", message, events, stuck=False)
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
                return waiting_status(body, "PoolBusy", message, events, stuck=False)
            events.append(("Bound", f"RolloutPool {run.spec.pool}"))
        for obj in trainer_objects.trainer_objects(run, body, pool):
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

    def _recorder(
        self,
        run: TrainingRun,
        pool: RolloutPool,
        body: Mapping[str, Any],
        client: TrainerClient,
    ) -> TraceRecorder | None:
        """The run's trace under `trace_dir`, opened; None when off, or when it cannot be
        written (said in the log and an Event: the run goes on without it)."""
        if self.trace_dir is None or not run.spec.trace.enabled:
            return None
        ns, name = run.metadata.namespace, run.metadata.name
        uid = str(body.get("metadata", {}).get("uid") or "")[:8]
        emulated = [g for g in pool.spec.groups if g.engine.backend == "emulated"]
        header = trace_header(
            pool,
            run,
            policy=run.spec.scheduler.policy,
            engine="emulated" if len(emulated) == len(pool.spec.groups) else "vllm",
            compression=pool.spec.emulated_speed if emulated else 1.0,
        )
        path = unused_path(
            self.trace_dir / ns / f"{name}-{uid}" if uid else self.trace_dir / ns / name
        )
        recorder = TraceRecorder(path, header, client, self.clock)
        try:
            recorder.open()
        except OSError as e:
            log.warning("run %s/%s: no trace: %s", ns, name, describe(e))
            self.post(body, "TraceFailed", f"cannot write the trace: {describe(e)}", True)
            return None
        self.post(body, "Tracing", f"the control loop writes its trace to {path}", False)
        return recorder

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
            await self.sleep(1.0)  # stopped is checked each turn
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
                await self.sleep(2.0)  # stopped is checked each turn
        if stopped:
            await client.aclose()
            return
        s = run.spec.scheduler
        loop = ControlLoop(
            POLICIES[s.policy](),
            LoopConfig(
                knobs=knobs_of(run, pool),
                period_s=s.control_period_s,
                max_tool_calls=run.spec.multi_turn.max_tool_calls,
                budgets=budgets_of(run),
            ),
            client,
            {},
            token,
            clock=self.clock,
            sleep=self.sleep,
        )
        recorder = self._recorder(run, pool, body, client)
        if recorder is not None:
            loop.trace = recorder
        reporter = RunReporter(
            self.kube,
            self.endpoint,
            self.status_every_s,
            run,
            pool,
            body,
            loop,
            client,
            self.post,
            clock=self.clock,
        )
        self.metrics.runs[(ns, name)] = reporter.series

        async def done() -> bool:
            return bool(stopped) or await reporter.done()

        started = self.clock()
        try:
            await loop.run(done)
        finally:
            self.metrics.runs.pop((ns, name), None)
            if recorder is not None:
                await _finish_trace(recorder, client, loop, self.clock() - started)
            await loop.aclose()
            await client.aclose()
