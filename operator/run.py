"""`cadence run FILE.yaml`: the whole system on one machine, from the resources kubectl
would apply. The pool's workers run on the emulated engine, several to a host process
(`worker/host.py`), each with its group's accelerator; the trainer runs in this process;
the shared control loop drives them with the run's policy until every batch is trained.
The result is one JSON object with the run's measures.
"""

from __future__ import annotations

import json
import secrets
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from cadence.operator.localpool import serve_trainer, worker_processes
from cadence.operator.loop import ControlLoop, LoopConfig
from cadence.operator.resources import RolloutPool, TrainingRun
from cadence.operator.scheduler.registry import POLICIES
from cadence.operator.scheduler.snapshot import Knobs
from cadence.sim.catalog import ACCELERATORS
from cadence.trainer.client import TrainerClient
from cadence.trainer.trainer import Trainer, TrainerConfig
from cadence.worker.api import Delivery
from cadence.worker.tinymodel import make_tiny_llama


@dataclass(frozen=True, slots=True)
class PoolWorker:
    id: str
    accelerator: str
    affinity: int
    price_per_hour: float


def pool_workers(pool: RolloutPool) -> list[PoolWorker]:
    out = []
    for g in pool.spec.groups:
        catalog = ACCELERATORS.get(g.accelerator)
        price = g.price_per_hour
        if price is None and catalog is not None and catalog.price_per_hour is not None:
            price = catalog.price_per_hour.value
        for i in range(g.replicas):
            out.append(PoolWorker(f"{g.name}-{i}", g.accelerator, g.affinity, price or 0.0))
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def run(
    pool: RolloutPool,
    training: TrainingRun,
    workdir: Path,
    *,
    policy: str | None = None,
    hosts: int = 2,
    compression: float = 1.0,
) -> dict[str, object]:
    spec = training.spec
    policy = policy or spec.scheduler.policy
    workdir.mkdir(parents=True, exist_ok=True)
    model = Path(spec.model.path) if spec.model.path else make_tiny_llama(workdir / "model")
    token = secrets.token_hex(16)
    config = TrainerConfig(
        model_path=model,
        state_dir=workdir / "trainer",
        task=spec.dataset.task,
        group_size=spec.batch.samples_per_prompt,
        batch_groups=spec.batch.prompts_per_batch,
        iterations=spec.batch.iterations,
        eta=spec.scheduler.eta,
        learning_rate=spec.trainer.learning_rate,
        clip_eps=spec.trainer.clip_eps,
        epochs=spec.trainer.epochs,
        advantages=spec.trainer.advantages,
        max_tokens=spec.batch.max_tokens,
        temperature=spec.batch.temperature,
    )
    trainer = Trainer(config)
    workers = pool_workers(pool)
    per_host: dict[str, list[PoolWorker]] = {}
    for i, w in enumerate(workers):
        per_host.setdefault(f"host-{i % max(1, hosts)}", []).append(w)
    async with serve_trainer(trainer, token) as trainer_url:

        def args(host: str) -> list[str]:
            hosted = [f"{w.id}:{w.accelerator}:{w.affinity}" for w in per_host[host]]
            return [
                *(a for h in hosted for a in ("--hosted", h)),
                *("--model-path", str(model), "--model", spec.model.catalog),
                *("--trainer-url", trainer_url, "--weights-dir", str(workdir / "weights")),
                *("--compression", str(compression), "--grace-s", "1"),
            ]

        with worker_processes(
            sorted(per_host), args, env={"CADENCE_TOKEN": token}, within_s=300, logs=workdir
        ) as hosts_up:
            urls = {w.id: f"{hosts_up[h]}/{w.id}" for h, ws in per_host.items() for w in ws}
            s = spec.scheduler
            knobs = Knobs(h_min=s.h_min, delta=s.delta, eta=s.eta, min_decode=s.min_decode)
            client = TrainerClient(trainer_url, token)
            loop = ControlLoop(
                POLICIES[policy](),
                LoopConfig(
                    knobs=knobs,
                    period_s=s.control_period_s,
                    max_tool_calls=spec.multi_turn.max_tool_calls,
                ),
                client,
                urls,
                token,
                hosts={hosts_up[h]: [w.id for w in ws] for h, ws in per_host.items()},
            )

            async def done() -> bool:
                with trainer.lock:
                    return trainer.ledger.consumed_batches >= config.iterations

            started = time.monotonic()
            await loop.run(done)
            wall = time.monotonic() - started
            await loop.aclose()
            await client.aclose()
    return _measures(trainer, loop, workers, wall, policy)


def _measures(
    trainer: Trainer, loop: ControlLoop, workers: list[PoolWorker], wall: float, policy: str
) -> dict[str, object]:
    with trainer.lock:
        ledger = trainer.ledger
        rows = ledger.db.execute(
            "SELECT delivery FROM samples WHERE state IN ('delivered', 'consumed')"
        ).fetchall()
        counts = ledger.counts()
        admitted = ledger.cursor * ledger.group_size
        ids = ledger.db.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM samples").fetchone()
        rewards = ledger.reward_by_version()
    deliveries = [Delivery.model_validate_json(r[0]) for r in rows]
    tokens = sum(len(t.token_ids) for d in deliveries for t in d.turns if t.role == "model")
    latencies = [
        d.finished_at - d.timings.first_step_at
        for d in deliveries
        if d.timings.first_step_at is not None
    ]
    dollars = sum(w.price_per_hour for w in workers) * wall / 3600
    ended = counts.get("delivered", 0) + counts.get("consumed", 0)
    cycles = [r.cycle_ms for r in loop.reports]
    return {
        "policy": policy,
        "workers": len(workers),
        "wall_seconds": round(wall, 1),
        "throughput_tok_s": round(tokens / wall, 1) if wall > 0 else 0.0,
        "latency_p50_s": round(statistics.median(latencies), 3) if latencies else 0.0,
        "latency_p95_s": round(_percentile(latencies, 0.95), 3),
        "tokens_per_dollar": round(tokens / dollars, 1) if dollars > 0 else None,
        "samples_admitted": admitted,
        "samples_delivered": ended,
        "samples_lost": admitted - ended,
        "samples_duplicated": int(ids[0]) - int(ids[1]),
        "samples_failed": counts.get("failed", 0),
        "requeued": sum(r.requeued for r in loop.reports),
        "cycle_ms_p50": round(statistics.median(cycles), 2) if cycles else 0.0,
        "cycle_ms_p95": round(_percentile(cycles, 0.95), 2),
        "cycle_ledger_ms_p95": round(_percentile([r.ledger_ms for r in loop.reports], 0.95), 2),
        "cycle_observe_ms_p95": round(_percentile([r.observe_ms for r in loop.reports], 0.95), 2),
        "cycle_plan_ms_p95": round(_percentile([r.plan_ms for r in loop.reports], 0.95), 2),
        "reward_by_version": [round(rewards[v], 4) for v in sorted(rewards)],
    }


def write(result: dict[str, object], path: Path) -> None:
    path.write_text(json.dumps(result, indent=2) + "\n")
