"""The simulator's event loop: a pool of modelled workers driven by a scheduling policy.

Time advances in control periods. Each period the policy sees a snapshot built exactly as
the runtime builds one (ids and lengths), its actions are applied (an eviction parks a
trajectory, a placement costs a re-prefill or a KV transfer, an advance loads weights),
then every worker's engine decodes until the period ends, trajectories that call a tool
wait for their environment, and the trainer consumes each complete batch and publishes
the next version. The run ends when exactly `iterations x B` groups have been consumed.

A run that stops making progress (nothing decoded, trained, loaded or awaited for
`STALL_S` simulated seconds with work unfinished) ends at once with a `StallError` that
says what is stuck, rather than spinning to the time limit.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from cadence.common.catalog import MODELS
from cadence.common.stats import percentile
from cadence.scheduler import (
    Action,
    Admission,
    Admit,
    Advance,
    Evict,
    FreshSample,
    PendingTrajectory,
    Place,
    Policy,
    Snapshot,
    WorkerView,
    check_no_stranding,
)
from cadence.scheduler.fresh_index import FreshIndex
from cadence.scheduler.moves import move_kind
from cadence.scheduler.pending_index import PendingIndex
from cadence.scheduler.snapshot import Transfer
from cadence.sim.engine import ModelledEngine, Request
from cadence.sim.records import (
    PeriodSample,
    Result,
    TracePoint,
    Trajectory,
    Worker,
    slowest_tenth_share,
    tail_anatomy,
)
from cadence.sim.resize import Resizer
from cadence.sim.scenario import Scenario, transfer_group

STALL_S = 600.0


class StallError(RuntimeError):
    """The run stopped making progress: a policy left work nowhere to go."""


class Simulation:
    def __init__(
        self, scenario: Scenario, policy: Policy[Any], *, trace: str | None = None
    ) -> None:
        self.scenario = scenario
        self.policy = policy
        self.state = policy.initial_state()
        self.model = MODELS[scenario.model]
        phys = scenario.physics
        self.now = 0.0
        self.workers: dict[str, Worker] = {}
        self._made: dict[str, int] = {}  # workers made so far per group, for their ids
        self._hourly, self._unpriced = 0.0, 0  # the priced workers' sum; workers unpriced
        for group, deployed in zip(scenario.groups, scenario.deployments(), strict=True):
            for _ in range(deployed.workers):
                self.add_worker(group.name)
        w = scenario.workload
        s = scenario.scheduling
        self.knobs = dataclasses.replace(s.knobs(), max_model_len=scenario.max_model_len)
        capacities = {wk.group: wk.deployment.kv_capacity_tokens for wk in self.workers.values()}
        check_no_stranding(capacities, scenario.max_model_len, self.knobs)
        self.total_groups = w.iterations * w.prompts_per_batch
        self._groups = scenario.groups_of_samples(random.Random(scenario.seed))
        self.trajectories: dict[str, Trajectory] = {}
        # What the snapshot shows, kept as it changes rather than rebuilt each period.
        self._fresh = FreshIndex(w.prompts_per_batch)
        self._pending = PendingIndex()
        self._in_env: dict[str, Trajectory] = {}
        # The last view of each worker, with the engine's change count and the version
        # it was taken at: a worker that neither decoded nor changed keeps its view.
        self._views: dict[str, tuple[tuple[int, int | None], WorkerView]] = {}
        self.admitted = 0
        self.newest = 0
        self.consumed = 0
        self.done_per_batch: dict[int, int] = {}
        self.done_per_group: dict[int, int] = {}
        self.complete_groups: list[int] = []  # in order of completion
        self.oldest_complete = getattr(policy, "trainer_takes", "") == "oldest_complete"
        self.training: float | None = None  # when the version being trained is published
        self.migrations = 0
        self.migrations_kv = 0
        self.migrated_kv_bytes = 0.0
        self.reprefilled_tokens = 0
        # Same-type links: a transfer group never spans accelerator types (clusters).
        self.transfer = Transfer(self.model.kv_bytes_per_token, phys.intra_cluster_gb_s * 1e9)
        self.timeline: list[PeriodSample] = []
        self.tool_departures = 0
        self._decoded_so_far = 0
        self._progress_at = 0.0  # when something last decoded, trained, loaded or returned
        self.traced = trace
        self.trace: list[TracePoint] = []
        # What removed workers decoded and preempted, and the pool's cost so far.
        self.retired_tokens = 0
        self.retired_preemptions = 0
        self.dollars = 0.0
        self.resizer = Resizer(scenario) if scenario.autoscaling is not None else None

    # --- the pool ----------------------------------------------------------------------

    def add_worker(self, group: str, start_s: float = 0.0) -> Worker:
        """A new worker of `group`, taking work `start_s` from now (with no weights: the
        policy advances it to a version, as it does any new worker)."""
        i = next(i for i, g in enumerate(self.scenario.groups) if g.name == group)
        g, d = self.scenario.groups[i], self.scenario.deployments()[i].deployment
        n = self._made.get(group, 0)
        self._made[group] = n + 1
        price = d.accelerator.price_per_hour
        engine = ModelledEngine(d, self.scenario.physics.max_batch)
        engine.time = self.now + start_s
        w = Worker(
            f"{group}-{n}",
            group,
            g.affinity,
            d,
            price.value * d.tp if price is not None else None,
            engine,
            transfer_group=transfer_group(d) if self.scenario.physics.kv_transfer else None,
        )
        self.workers[w.id] = w
        self._priced(w, 1)
        return w

    def _priced(self, w: Worker, sign: int) -> None:
        """The pool's price kept as workers come and go, not summed each period."""
        if w.price_per_hour is None:
            self._unpriced += sign
        else:
            self._hourly += sign * w.price_per_hour

    def remove_worker(self, wid: str) -> None:
        """Drain `wid` and let it go: what it held waits to be placed elsewhere (a move,
        re-prefilled: its KV goes with it), as a drained pod's residents do."""
        w = self.workers.pop(wid)
        self._views.pop(wid, None)
        for rid, _ in w.engine.residents():
            self._depart(rid, w, parked_on=None)
        self.retired_tokens += w.engine.decoded_tokens
        self.retired_preemptions += w.engine.preemptions
        self._priced(w, -1)

    @property
    def price_per_hour(self) -> float | None:
        """What the pool costs an hour now; None if a worker has no price."""
        return None if self._unpriced else self._hourly

    # --- observation -----------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        views = []
        for w in self.workers.values():
            seen = self._views.get(w.id)
            stamp = (w.engine.changes, w.version)
            if seen is None or seen[0] != stamp:
                presorted = w.engine.presorted()
                capacity = w.deployment.kv_capacity_tokens
                if presorted is not None:
                    view = WorkerView.of_presorted(
                        w.id,
                        w.accelerator,
                        w.affinity,
                        w.version,
                        capacity,
                        presorted,
                        max_seqs=w.engine.max_batch,
                        cost=w.cost,
                        transfer_group=w.transfer_group,
                    )
                else:  # requests wait in the engine's queue: not in its running order
                    view = WorkerView(
                        w.id,
                        w.accelerator,
                        w.affinity,
                        w.version,
                        capacity,
                        tuple(w.engine.resident_views()),
                        max_seqs=w.engine.max_batch,
                        cost=w.cost,
                        transfer_group=w.transfer_group,
                    )
                seen = self._views[w.id] = (stamp, view)
            views.append(seen[1])
        return Snapshot(
            now=self.now,
            workers=tuple(views),
            pending=tuple(self._pending),
            fresh=self._fresh.frozen(),
            fresh_index=self._fresh.by_batch(),
            pending_index=self._pending.order(),
            newest_version=self.newest,
            admission=Admission(
                self.admitted, self.scenario.workload.prompts_per_batch, self.total_groups
            ),
            knobs=self.knobs,
            seed=self.scenario.seed,
            transfer=self.transfer,
        )

    # --- actions -----------------------------------------------------------------------

    def apply(self, actions: Sequence[Action]) -> None:
        for a in actions:
            if isinstance(a, Admit):
                self._admit(a.groups)
            elif isinstance(a, Advance):
                self._advance(a)
            elif isinstance(a, Evict):
                self._evict(a)
            elif isinstance(a, Place):
                self._place(a)

    def _admit(self, groups: int) -> None:
        for _ in range(groups):
            for sample in next(self._groups):
                t = Trajectory(sample, context=sample.prompt_tokens)
                self.trajectories[sample.id] = t
                self._fresh.add(FreshSample(sample.id, sample.group, sample.prompt_tokens))
            self.admitted += 1

    def _advance(self, a: Advance) -> None:
        w = self.workers[a.worker]
        if not w.engine.idle or (w.version is not None and a.version <= w.version):
            raise AssertionError(f"invalid advance of {w.id} to {a.version}")
        w.version = a.version
        phys = self.scenario.physics
        load = self.model.weight_bytes / ((phys.weights_load_gb_s or phys.intra_cluster_gb_s) * 1e9)
        w.engine.time = max(w.engine.time, self.now) + load

    def _evict(self, a: Evict) -> None:
        self._depart(a.trajectory, self.workers[a.worker], parked_on=a.worker)

    def _depart(self, rid: str, w: Worker, parked_on: str | None) -> None:
        """`rid` leaves `w` and waits to be placed, parked on `parked_on` (None: its KV
        went with a worker that is gone)."""
        t = self.trajectories[rid]
        request = w.engine.remove(rid)
        t.context = request.context
        t.generated = t.context - t.sample.prompt_tokens - t.observed
        t.state, t.worker, t.parked_on, t.pending_since = "pending", None, parked_on, self.now
        t.moves += 1
        t.evicted = True
        assert t.version is not None
        self._pending.put(
            PendingTrajectory(t.sample.id, t.version, t.context, self.now, parked_on=parked_on)
        )

    def _place(self, a: Place) -> None:
        t = self.trajectories[a.trajectory]
        w = self.workers[a.worker]
        if w.version != a.version:
            raise AssertionError(f"{a.trajectory} placed on {w.id} of another version")
        request = Request(t.sample.id, t.context, t.next_stop())
        if t.state == "fresh":
            self._fresh.take(t.sample.id)
            t.version = t.start_version = w.version
            request.load_s = w.deployment.prefill_s(t.context)
        elif t.state == "pending":
            self._pending.take(t.sample.id)
            t.waited_s += self.now - (t.pending_since if t.evicted else t.env_until)
            if t.version != w.version:
                if not getattr(self.policy, "spans_versions", False):
                    raise AssertionError(f"{a.trajectory} of v{t.version} on v{w.version}")
                t.version = w.version  # AReaL-like: its next tokens come from the new version
                t.versions_spanned += 1
            source = self.workers.get(t.parked_on or "")
            kind = move_kind(
                self.knobs.migration,
                t.parked_on if source is not None else None,
                source.transfer_group if source is not None else None,
                w.id,
                w.transfer_group,
            )
            if kind == "kv":  # the scheduler's rule: same transfer group, knob not reprefill
                request.ready_at = self.now + self.transfer.pull_s(t.context)
            else:
                request.load_s = w.deployment.prefill_s(t.context)
            if t.evicted:  # a move the policy made (not a return from a tool call)
                self.migrations += 1
                if kind == "kv":
                    self.migrations_kv += 1
                    self.migrated_kv_bytes += t.context * self.model.kv_bytes_per_token
                else:
                    self.reprefilled_tokens += t.context
                t.evicted = False
        else:
            raise AssertionError(f"{a.trajectory} placed while {t.state}")
        t.state, t.worker, t.parked_on = "running", w.id, None
        w.engine.add(request)

    # --- time --------------------------------------------------------------------------

    def _decode_until(self, until: float) -> None:
        for w in self.workers.values():
            stops = w.engine.run_until(until)
            for rid, at in w.engine.started:
                t = self.trajectories[rid]
                if t.first_step is None:  # placed, then waited in the engine's queue
                    t.first_step = at
            w.engine.started.clear()
            for stop in stops:
                t = self.trajectories[stop.request.id]
                t.context = stop.request.context
                t.generated = t.context - t.sample.prompt_tokens - t.observed
                t.worker = None
                if t.generated >= t.sample.response_tokens:
                    t.state, t.done_at = "done", stop.time
                    group = t.sample.group
                    batch = group // self.scenario.workload.prompts_per_batch
                    self.done_per_batch[batch] = self.done_per_batch.get(batch, 0) + 1
                    self.done_per_group[group] = self.done_per_group.get(group, 0) + 1
                    if self.done_per_group[group] == self.scenario.workload.samples_per_prompt:
                        self.complete_groups.append(group)
                else:
                    latency = t.sample.env_latencies_s[t.calls_made]
                    t.calls_made += 1
                    self.tool_departures += 1
                    t.state, t.parked_on = "env", w.id
                    t.pending_since, t.env_until = stop.time, stop.time + latency
                    assert t.version is not None
                    self._in_env[t.sample.id] = t
                    self._pending.put(
                        PendingTrajectory(t.sample.id, t.version, t.context, stop.time, False, w.id)
                    )

    def _environments(self, until: float) -> None:
        for rid, t in list(self._in_env.items()):
            if t.env_until > until:
                continue
            del self._in_env[rid]
            t.observed += t.sample.observation_tokens
            t.context += t.sample.observation_tokens
            t.state = "pending"
            assert t.version is not None
            self._pending.put(
                PendingTrajectory(rid, t.version, t.context, t.pending_since, parked_on=t.parked_on)
            )

    def _train(self, now: float) -> None:
        """Batch u is consumed once all of it is complete and version u is the newest;
        version u + 1 is published after the update and the weights' distribution."""
        w = self.scenario.workload
        if self.training is not None:
            if now < self.training:
                return
            self.newest += 1
            self.training = None
        u = self.newest
        if self.consumed > u or u >= w.iterations:
            return
        if self.oldest_complete:
            # AReaL-like: the update takes the B oldest complete groups, whatever batch.
            ready = len(self.complete_groups) >= (u + 1) * w.prompts_per_batch
        else:
            ready = self.done_per_batch.get(u, 0) == w.prompts_per_batch * w.samples_per_prompt
        if ready:
            self.consumed += 1
            send = self.model.weight_bytes / (self.scenario.trainer.weights_link_gb_s * 1e9)
            self.training = now + self.scenario.trainer.update_seconds + send

    @property
    def finished(self) -> bool:
        return self.consumed >= self.scenario.workload.iterations

    def step(self) -> None:
        """One control period: observe, plan, apply (and resize the pool, under
        autoscaling), then let time run to its end."""
        snapshot = self.snapshot()
        actions, self.state = self.policy.plan(snapshot, self.state)
        # The resizer reads the snapshot (valid until the plan is applied) and the plan,
        # and resizes once the plan has been applied to the workers it named.
        signal = self.resizer.observe(self, snapshot, actions) if self.resizer else None
        self.apply(actions)
        if self.resizer is not None and signal is not None:
            self.resizer.act(self, signal)
        price = self.price_per_hour
        if price is not None:
            self.dollars += price * self.scenario.scheduling.control_period_s / 3600.0
        until = self.now + self.scenario.scheduling.control_period_s
        self._decode_until(until)
        self._environments(until)
        self.now = until
        self._train(self.now)
        self._record()

    def _record(self) -> None:
        decoded = 0
        kv: dict[str, int] = {}
        count: dict[str, int] = {}
        for w in self.workers.values():
            decoded += w.engine.decoded_tokens
            n, tokens = w.engine.assigned()
            a = w.accelerator
            kv[a] = kv.get(a, 0) + tokens
            count[a] = count.get(a, 0) + n
        self.timeline.append(
            PeriodSample(
                self.now,
                decoded - self._decoded_so_far,
                self.newest,
                {a: kv[a] / count[a] for a in kv if count[a]},
            )
        )
        self._decoded_so_far = decoded
        if self.traced is not None:
            self._trace(self.traced)

    def _trace(self, rid: str) -> None:
        t = self.trajectories.get(rid)
        if t is None or t.first_step is None:
            return
        if t.state == "done":
            if not self.trace or self.trace[-1].generated < t.sample.response_tokens:
                self.trace.append(TracePoint(self.now, False, 0.0, t.sample.response_tokens))
            return
        if t.state == "running" and t.worker is not None:
            engine = self.workers[t.worker].engine
            if not engine.is_running(rid):  # queued behind the engine's batch limit
                self.trace.append(TracePoint(self.now, False, 0.0, t.generated))
                return
            own = engine.context_of(rid)
            generated = own - t.sample.prompt_tokens - t.observed
            self.trace.append(TracePoint(self.now, True, own / engine.running_kv(), generated))
        else:
            self.trace.append(TracePoint(self.now, False, 0.0, t.generated))

    def run(
        self, max_seconds: float = 1e7, on_batch: Callable[[int, float], None] | None = None
    ) -> Result:
        """Step to the end; `on_batch(consumed, now)` hears of each batch consumed."""
        while not self.finished:
            consumed = self.consumed
            self.step()
            if on_batch is not None and self.consumed != consumed:
                on_batch(self.consumed, self.now)
            if self._moving() or self.consumed != consumed:
                self._progress_at = self.now
            elif self.now - self._progress_at > STALL_S:
                raise StallError(self._what_is_stuck())
            if self.now > max_seconds:
                raise StallError(
                    f"no end after {max_seconds:.0f} simulated seconds: "
                    f"{self.consumed} of {self.scenario.workload.iterations} batches consumed"
                )
        return self.result()

    def _moving(self) -> bool:
        """Whether the last period did anything: decoded, trained, loaded weights or a
        prefill or a transfer, or had a trajectory waiting on its environment."""
        return bool(
            (self.timeline and self.timeline[-1].tokens)
            or self.training is not None
            or self._in_env
            or any(w.engine.busy_after(self.now) for w in self.workers.values())
        )

    def _what_is_stuck(self) -> str:
        b = self.scenario.workload.prompts_per_batch
        versions: dict[int | None, int] = {}
        for w in self.workers.values():
            versions[w.version] = versions.get(w.version, 0) + 1
        fresh_batches = sorted({f.group // b for f in self._fresh.samples.values()})
        pending_versions = sorted({p.version for p in self._pending})
        residents = sum(w.engine.assigned()[0] for w in self.workers.values())
        served = ", ".join(
            f"{n} on v{v}" if v is not None else f"{n} with no weights yet"
            for v, n in sorted(versions.items(), key=str)
        )
        return (
            f"{getattr(self.policy, 'name', 'the policy')} stalled: nothing decoded for "
            f"{STALL_S:.0f} simulated seconds at t = {self.now:,.0f} s, with "
            f"{len(self._fresh)} fresh sample(s) of batch(es) {fresh_batches or '-'}, "
            f"{len(self._pending)} pending of version(s) {pending_versions or '-'} and "
            f"{residents} resident(s); newest version {self.newest}, "
            f"{self.consumed} of {self.scenario.workload.iterations} batches consumed; "
            f"workers: {served}"
        )

    def max_version_lag(self) -> int:
        """The most versions a consumed sample's training batch ran ahead of the version it
        started on (AReaL-like's batches are the oldest complete groups, in that order)."""
        b = self.scenario.workload.prompts_per_batch
        if self.oldest_complete:
            update_of = {g: i // b for i, g in enumerate(self.complete_groups[: self.consumed * b])}
        else:
            update_of = {g: g // b for g in range(self.consumed * b)}
        lags = [
            update_of[t.sample.group] - t.start_version
            for t in self.trajectories.values()
            if t.start_version is not None and t.sample.group in update_of
        ]
        return max(lags, default=0)

    def result(self) -> Result:
        done = [t for t in self.trajectories.values() if t.state == "done"]
        latencies = [
            t.done_at - t.first_step for t in done if t.done_at and t.first_step is not None
        ]
        tokens = self.retired_tokens + sum(w.engine.decoded_tokens for w in self.workers.values())
        b = self.scenario.workload.prompts_per_batch
        extras: dict[str, Any] = {
            "slowest_tenth_time_share": slowest_tenth_share(done, b),
            **tail_anatomy(done, b),
        }
        if self.resizer is not None:
            extras["autoscaling"] = self.resizer.summary(self)
        priced = self.price_per_hour is not None
        return Result(
            policy=getattr(self.policy, "name", type(self.policy).__name__),
            throughput_tok_s=tokens / self.now,
            latency_p50_s=statistics.median(latencies),
            latency_p95_s=percentile(latencies, 0.95),
            tokens_per_dollar=tokens / self.dollars if self.dollars and priced else None,
            trajectories=len(done),
            migrations=self.migrations,
            migrations_kv=self.migrations_kv,
            migrations_reprefill=self.migrations - self.migrations_kv,
            migrated_kv_bytes=self.migrated_kv_bytes,
            reprefilled_tokens=self.reprefilled_tokens,
            reprefilled_kv_bytes=float(self.reprefilled_tokens * self.model.kv_bytes_per_token),
            preemptions=self.retired_preemptions
            + sum(w.engine.preemptions for w in self.workers.values()),
            simulated_seconds=self.now,
            generated_tokens=tokens,
            staleness_bound=self.policy.staleness_bound(self.knobs.eta),
            max_version_lag=self.max_version_lag(),
            tool_departures=self.tool_departures,
            extras=extras,
            timeline=self.timeline,
            trace=self.trace,
        )
