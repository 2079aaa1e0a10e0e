"""A small time-stepped rollout pool that applies a policy's plans, for multi-cycle tests.

Not the simulator (that models accelerators and time properly): here each step every
resident decodes `speed` tokens of its worker, trajectories finish at lengths drawn from
a seeded heavy-tailed distribution, tool calls send a trajectory to its environment for a
few steps, and a trainer consumes batch u once all of it is complete and publishes
version u + 1 after `train_steps`. Every plan is checked by `invariants.check_plan`, and
the world itself checks that every trajectory is in exactly one place.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

from cadence.scheduler import (
    Admission,
    Admit,
    Advance,
    CadencePolicy,
    CadenceState,
    Evict,
    FreshSample,
    Knobs,
    PendingTrajectory,
    Place,
    Resident,
    Snapshot,
    StepCost,
    WorkerView,
)

from .invariants import check_plan


@dataclass
class ToyWorker:
    id: str
    capacity: int
    affinity: int = 0
    speed: int = 1
    version: int | None = None
    residents: set[str] = field(default_factory=set)
    cost: StepCost | None = None  # what the scheduler is told of its steps


@dataclass
class Trajectory:
    id: str
    group: int
    prompt: int
    length: int  # tokens to generate in all
    tool_calls: list[int]  # generated-token counts at which it calls its environment
    generated: int = 0
    observed: int = 0  # tokens appended by environment observations
    version: int | None = None
    where: str = "fresh"  # "fresh", "pending", "env", "done" or a worker id
    decoded_since_placement: int = 0
    env_until: int = 0
    moves: int = 0
    first_step: int | None = None
    done_step: int | None = None

    @property
    def context(self) -> int:
        return self.prompt + self.generated + self.observed


@dataclass
class ToyConfig:
    workers: list[ToyWorker]
    batch_size: int = 2
    samples: int = 4
    iterations: int = 4
    knobs: Knobs = field(default_factory=lambda: Knobs(h_min=40, delta=8, eta=1, min_decode=16))
    median_length: int = 120
    sigma: float = 1.0
    max_length: int = 1200
    prompt: tuple[int, int] = (8, 40)
    tool_call_rate: float = 0.0
    env_steps: int = 3
    observation: int = 10
    train_steps: int = 2
    seed: int = 0
    fit: Literal["tight", "worst"] = "tight"


class ToyWorld:
    def __init__(self, cfg: ToyConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.policy = CadencePolicy(fit=cfg.fit)
        self.state: CadenceState = self.policy.initial_state()
        self.workers = {w.id: w for w in cfg.workers}
        self.trajectories: dict[str, Trajectory] = {}
        self.admitted = 0
        self.newest = 0
        self.consumed = 0
        self.training_until: int | None = None
        self.step_no = 0
        self.delivered: list[str] = []
        self.preemptions = 0
        # (step, worker, version, alone): a concentration source advancing, and whether
        # it is then the only worker serving its new version.
        self.source_advances: list[tuple[int, str, int, bool]] = []
        # Per step, each worker's mean resident context (None when it has no residents).
        self.mean_context: list[dict[str, float | None]] = []
        self.counts: list[dict[str, int]] = []

    @property
    def total_groups(self) -> int:
        return self.cfg.iterations * self.cfg.batch_size

    def _draw_length(self, group_mu: float) -> int:
        n = int(math.exp(self.rng.gauss(group_mu, self.cfg.sigma * 0.5)))
        return max(1, min(self.cfg.max_length, n))

    def _admit(self, groups: int) -> None:
        for _ in range(groups):
            g = self.admitted
            mu = self.rng.gauss(math.log(self.cfg.median_length), self.cfg.sigma * 0.85)
            prompt = self.rng.randint(*self.cfg.prompt)
            for s in range(self.cfg.samples):
                length = self._draw_length(mu)
                calls = [
                    self.rng.randint(1, max(1, length - 1))
                    for _ in range(12)
                    if self.rng.random() < self.cfg.tool_call_rate
                ]
                tid = f"g{g}s{s}"
                self.trajectories[tid] = Trajectory(tid, g, prompt, length, sorted(set(calls)))
            self.admitted += 1

    def snapshot(self) -> Snapshot:
        by_worker: dict[str, list[Resident]] = {w: [] for w in self.workers}
        pending: list[PendingTrajectory] = []
        fresh: list[FreshSample] = []
        for t in self.trajectories.values():
            if t.where in self.workers:
                by_worker[t.where].append(Resident(t.id, t.context, t.decoded_since_placement))
            elif t.where in ("pending", "env"):
                assert t.version is not None
                pending.append(
                    PendingTrajectory(t.id, t.version, t.context, 0.0, t.where == "pending")
                )
            elif t.where == "fresh":
                fresh.append(FreshSample(t.id, t.group, t.prompt))
        return Snapshot(
            now=float(self.step_no),
            workers=tuple(
                WorkerView(
                    w.id,
                    "toy",
                    w.affinity,
                    w.version,
                    w.capacity,
                    tuple(by_worker[w.id]),
                    cost=w.cost,
                )
                for w in self.workers.values()
            ),
            pending=tuple(pending),
            fresh=tuple(fresh),
            newest_version=self.newest,
            admission=Admission(self.admitted, self.cfg.batch_size, self.total_groups),
            knobs=self.cfg.knobs,
        )

    def step(self) -> None:
        snap = self.snapshot()
        actions, new_state = self.policy.plan(snap, self.state)
        check_plan(snap, self.state, actions, new_state)
        snap_sources = set(self.state.sources.values())
        self.state = new_state
        for a in actions:
            if isinstance(a, Admit):
                self._admit(a.groups)
            elif isinstance(a, Advance):
                w = self.workers[a.worker]
                assert not w.residents
                w.version = a.version
                if a.worker in self.state.sources.values() or a.worker in snap_sources:
                    alone = all(o.version != a.version for o in self.workers.values() if o is not w)
                    self.source_advances.append((self.step_no, w.id, a.version, alone))
            elif isinstance(a, Evict):
                t = self.trajectories[a.trajectory]
                assert t.where == a.worker
                self.workers[a.worker].residents.remove(t.id)
                t.where = "pending"
                t.moves += 1
            elif isinstance(a, Place):
                t = self.trajectories[a.trajectory]
                w = self.workers[a.worker]
                assert t.where in ("fresh", "pending"), f"{t.id} is at {t.where}"
                if t.where == "fresh":
                    t.version = w.version
                    t.first_step = self.step_no
                assert t.version == w.version
                t.where = w.id
                t.decoded_since_placement = 0
                w.residents.add(t.id)
        self._decode()
        self._environment()
        self._train()
        self.step_no += 1

    def _decode(self) -> None:
        means: dict[str, float | None] = {}
        self.mean_context.append(means)
        self.counts.append({w.id: len(w.residents) for w in self.workers.values()})
        for w in self.workers.values():
            used = sum(self.trajectories[t].context for t in w.residents)
            means[w.id] = used / len(w.residents) if w.residents else None
            growth = {
                tid: min(w.speed, self.trajectories[tid].length - self.trajectories[tid].generated)
                for tid in w.residents
            }
            while len(w.residents) > 1 and used + sum(growth.values()) > w.capacity:
                # Out of KV: like vLLM, the engine preempts its newest request; here the
                # worker departs it to pending rather than recomputing it in place.
                newest = min(
                    w.residents,
                    key=lambda t: (self.trajectories[t].decoded_since_placement, t),
                )
                w.residents.discard(newest)
                used -= self.trajectories[newest].context
                del growth[newest]
                self.trajectories[newest].where = "pending"
                self.preemptions += 1
            for tid in sorted(w.residents):
                t = self.trajectories[tid]
                t.generated += growth[tid]
                t.decoded_since_placement += growth[tid]
                if t.generated >= t.length:
                    w.residents.discard(tid)
                    t.where = "done"
                    t.done_step = self.step_no
                    self.delivered.append(tid)
                elif t.tool_calls and t.generated >= t.tool_calls[0]:
                    t.tool_calls.pop(0)
                    w.residents.discard(tid)
                    t.where = "env"
                    t.env_until = self.step_no + self.cfg.env_steps

    def _environment(self) -> None:
        for t in self.trajectories.values():
            if t.where == "env" and self.step_no >= t.env_until:
                t.observed += self.cfg.observation
                t.where = "pending"

    def _train(self) -> None:
        if self.training_until is not None:
            if self.step_no >= self.training_until:
                self.training_until = None
                self.consumed += 1
                self.newest += 1
            return
        if self.consumed >= self.cfg.iterations:
            return
        u = self.consumed
        members = [t for t in self.trajectories.values() if t.group // self.cfg.batch_size == u]
        if len(members) == self.cfg.batch_size * self.cfg.samples and all(
            t.where == "done" for t in members
        ):
            for t in members:
                assert t.version is not None and t.version >= u - self.cfg.knobs.eta
            self.training_until = self.step_no + self.cfg.train_steps

    def _progress(self) -> tuple[int, int, int, int]:
        tokens = sum(t.generated for t in self.trajectories.values())
        return (tokens, len(self.delivered), self.consumed, self.newest)

    def run(self, max_steps: int, stall_steps: int = 500) -> bool:
        """Step until every batch is consumed; False if `max_steps` ran out first or
        nothing at all happened for `stall_steps` steps (a deadlock)."""
        last, since = self._progress(), 0
        while self.consumed < self.cfg.iterations:
            if self.step_no >= max_steps or since >= stall_steps:
                return False
            self.step()
            now = self._progress()
            last, since = now, (since + 1 if now == last else 0)
        return True

    @property
    def max_moves(self) -> int:
        return max((t.moves for t in self.trajectories.values()), default=0)
