"""Scheduler benchmark: how long one planning cycle takes at pool scale.

Plans repeated cycles on synthetic snapshots and prints one JSON object per phase, then
a last line with the worst phase's figures (`cadence bench scheduler --help`). Three
phases: pacing-heavy (two live versions with fresh work, many workers at or below the
floor, a large pending set), concentration-heavy (an exhausted older version
concentrating its tail while the newest takes fresh work) and tail (one version, no
fresh work anywhere: work conservation moves the tail up the affinity ranks). Workers
carry a sequence limit and a step cost by affinity rank, the floor and reserve are
auto and the longest context is known (so the fit rule's roomy tier is in play): every
rule of the default policy is on the clock. State is carried from cycle to cycle as the
control loop carries it. `cycle_ms` times `plan()` alone; `build_ms`
times building the snapshot from the observed residents and pending trajectories (the
observer's cost, reported apart so neither hides the other).

Absolute times do not travel between machines, so each phase also reports
`calibration_ms`, one sort of all the residents by context length timed in the same
process, and `cycle_ms_p99_over_calibration`: a figure that compares across machines.
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import time

# `_operator` is the C module behind the standard `operator` (see scheduler/snapshot.py).
from _operator import attrgetter
from collections.abc import Sequence
from dataclasses import dataclass

from cadence.common.stats import percentile
from cadence.scheduler import (
    Action,
    Admission,
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

# KV tokens per worker: Qwen3-8B (16.4 GB of weights, 147,456 KV bytes per token) on an
# 80 GB accelerator, less a reserve: about 400K tokens. The paper's max_model_len is 64K.
CAPACITY = 400_000
MAX_MODEL_LEN = 65_536
KNOBS = Knobs(
    h_min=4_096,
    delta=512,
    eta=2,
    min_decode=64,
    auto_h_min=True,
    auto_delta=True,
    max_model_len=MAX_MODEL_LEN,
)
BATCH = 512
MAX_SEQS = 256
# Qwen3-8B's roofline on H100-class devices, slower by affinity rank (rank 2 fastest).
COSTS = {
    rank: StepCost(
        weights_s=6.5e-3 * (3 - rank),
        kv_token_s=5.9e-8 * (3 - rank),
        seq_s=2.8e-5 * (3 - rank),
        overhead_s=5e-5,
        prefill_token_s=2.8e-5 * (3 - rank),
    )
    for rank in range(3)
}


# Fixed seeds: every run plans the same pools. Tail: every version's fresh work is
# exhausted and none newer exists, so work conservation moves the tail up.
PHASE_SEEDS = {"pacing": 1, "concentration": 2, "tail": 3}
GROWTH = 16  # tokens each resident decodes per control period
COMPLETE = 1 / 400  # chance a resident finishes in one period


_CONTEXT = attrgetter("context")


@dataclass
class Pool:
    """The bench's evolving pool: what an observer would see each cycle.

    Between cycles the caller's side is played out coarsely: actions are applied,
    residents grow by one period's decode and some finish, and P_v and the fresh pool
    are topped back up (returns from environments, new admissions) so every cycle plans
    over the requested number of pending trajectories.
    """

    phase: str
    workers: dict[str, tuple[int, int | None, list[Resident]]]
    pending: dict[str, PendingTrajectory]
    fresh: dict[str, FreshSample]
    newest: int
    admitted: int
    rng: random.Random
    pending_target: int
    serial: int = 0

    def _next_id(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    def snapshot(self) -> Snapshot:
        return Snapshot(
            now=float(self.serial),
            workers=tuple(
                WorkerView(
                    wid, "bench", aff, ver, CAPACITY, tuple(rs), max_seqs=MAX_SEQS, cost=COSTS[aff]
                )
                for wid, (aff, ver, rs) in self.workers.items()
            ),
            pending=tuple(self.pending.values()),
            fresh=tuple(self.fresh.values()),
            newest_version=self.newest,
            admission=Admission(
                self.admitted, BATCH, self.admitted if self.phase == "tail" else 1_000 * BATCH
            ),
            knobs=KNOBS,
        )

    def top_up(self) -> None:
        rng = self.rng
        while len(self.pending) < self.pending_target:
            version = self.newest - (len(self.pending) % 2)
            if self.phase == "concentration":
                version = self.newest - 1
            elif self.phase == "tail":
                version = self.newest
            tid = self._next_id("p")
            ctx = int(min(MAX_MODEL_LEN, 500 + rng.lognormvariate(8.3, 1.0)))
            self.pending[tid] = PendingTrajectory(tid, version, ctx, 0.0, rng.random() > 0.15)
        # Pacing: fresh work both live versions may start (batch v - 1 + eta);
        # concentration: work only the newest may start (batch v + eta).
        batch = self.newest + KNOBS.eta - (1 if self.phase == "pacing" else 0)
        while self.phase != "tail" and len(self.fresh) < self.pending_target // 2:
            fid = self._next_id("f")
            group = batch * BATCH + rng.randint(0, BATCH - 1)
            self.fresh[fid] = FreshSample(fid, group, rng.randint(64, 1_024))

    def apply(self, actions: Sequence[Action]) -> None:
        for a in actions:
            if isinstance(a, Evict):
                aff, ver, rs = self.workers[a.worker]
                r = next(r for r in rs if r.id == a.trajectory)
                rs.remove(r)
                assert ver is not None
                self.pending[r.id] = PendingTrajectory(r.id, ver, r.context, 0.0)
            elif isinstance(a, Place):
                self.pending.pop(a.trajectory, None) or self.fresh.pop(a.trajectory)
                self.workers[a.worker][2].append(Resident(a.trajectory, a.context, 0))
            elif isinstance(a, Advance):
                aff, _, rs = self.workers[a.worker]
                self.workers[a.worker] = (aff, a.version, rs)
        for _, _, rs in self.workers.values():
            rs[:] = [
                Resident(r.id, r.context + GROWTH, r.decoded_since_placement + GROWTH)
                for r in rs
                if self.rng.random() > COMPLETE
            ]


def _pool(phase: str, workers: int, trajectories: int, pending: int, seed: int) -> Pool:
    rng = random.Random(seed)
    per_worker = max(1, trajectories // workers)
    newest = 3
    ws: dict[str, tuple[int, int | None, list[Resident]]] = {}
    for i in range(workers):
        wid = f"w{i:05d}"
        version = newest if phase == "tail" else newest - (i % 2)
        fill = rng.uniform(0.85, 1.0)
        weights = [rng.lognormvariate(0.0, 1.0) for _ in range(per_worker)]
        scale = fill * CAPACITY / sum(weights)
        residents = [
            Resident(f"{wid}-r{k}", max(16, int(w * scale)), rng.randint(0, 4_000))
            for k, w in enumerate(weights)
        ]
        ws[wid] = (i % 3, version, residents)
    admitted = (newest + KNOBS.eta + 1) * BATCH
    pool = Pool(phase, ws, {}, {}, newest, admitted, rng, pending)
    pool.top_up()
    return pool


def run_phase(
    phase: str, workers: int, trajectories: int, pending: int, *, cycles: int, warmup: int
) -> dict[str, object]:
    pool = _pool(phase, workers, trajectories, pending, seed=PHASE_SEEDS[phase])
    policy = CadencePolicy()
    state = CadenceState()
    plan_ms: list[float] = []
    build_ms: list[float] = []
    actions = residents = 0
    gc_ms: list[float] = []
    for cycle in range(warmup + cycles):
        start = time.perf_counter()
        snap = pool.snapshot()
        # As the control loop does: no cyclic collection while planning (a plan allocates
        # no cycles, so reference counting frees everything it drops); the collector runs
        # in the idle rest of the period instead.
        gc.disable()
        built = time.perf_counter()
        planned, state = policy.plan(snap, state)
        done = time.perf_counter()
        gc.enable()
        pool.apply(planned)
        pool.top_up()
        idle = time.perf_counter()
        gc.collect()
        collected = time.perf_counter()
        if cycle >= warmup:
            build_ms.append((built - start) * 1_000)
            plan_ms.append((done - built) * 1_000)
            gc_ms.append((collected - idle) * 1_000)
            actions += len(planned)
            residents += sum(len(w.residents) for w in snap.workers)
    calibration = calibrate(snap)
    return {
        "phase": phase,
        "workers": workers,
        "trajectories": round(residents / cycles),
        "pending": pending,
        "cycles": cycles,
        "actions_per_cycle": round(actions / cycles, 1),
        "cycle_ms_p50": round(statistics.median(plan_ms), 3),
        "cycle_ms_p99": round(percentile(plan_ms, 0.99), 3),
        "build_ms_p50": round(statistics.median(build_ms), 3),
        "build_ms_p99": round(percentile(build_ms, 0.99), 3),
        "idle_gc_ms_p50": round(statistics.median(gc_ms), 3),
        "calibration_ms": round(calibration, 3),
        "cycle_ms_p99_over_calibration": round(percentile(plan_ms, 0.99) / calibration, 2),
    }


def calibrate(snapshot: Snapshot, repeats: int = 21) -> float:
    """Milliseconds of one sort of every resident of `snapshot`, shuffled, by context
    length (the median of `repeats`): the unit the bench's ratios are in."""
    residents = [r for w in snapshot.workers for r in w.residents]
    random.Random(0).shuffle(residents)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sorted(residents, key=_CONTEXT)
        times.append((time.perf_counter() - start) * 1_000)
    return statistics.median(times)


def main(
    workers: int, trajectories: int, pending: int, *, cycles: int, phase: str, warmup: int = 5
) -> dict[str, object]:
    """Run the benchmark, print a JSON line per phase and the summary line; return it."""
    phases = list(PHASE_SEEDS) if phase == "both" else [phase]
    results = [
        run_phase(p, workers, trajectories, pending, cycles=cycles, warmup=warmup) for p in phases
    ]
    for r in results:
        print(json.dumps(r), flush=True)
    worst = max(results, key=lambda r: float(str(r["cycle_ms_p99"])))
    summary = {
        "workers": workers,
        "trajectories": trajectories,
        "pending": pending,
        "cycle_ms_p50": max(float(str(r["cycle_ms_p50"])) for r in results),
        "cycle_ms_p99": worst["cycle_ms_p99"],
        "worst_phase": worst["phase"],
        "calibration_ms": min(float(str(r["calibration_ms"])) for r in results),
        "cycle_ms_p99_over_calibration": max(
            float(str(r["cycle_ms_p99_over_calibration"])) for r in results
        ),
    }
    print(json.dumps(summary), flush=True)
    return summary
