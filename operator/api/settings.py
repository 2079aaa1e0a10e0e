"""What a TrainingRun's spec sets in the components it drives: the scheduler's `Knobs`
and the trainer's `TrainerConfig`. The operator and `cadence run` both build them here,
so a run file means the same on a cluster and on one machine."""

from __future__ import annotations

from pathlib import Path

from cadence.operator.api.resources import SIZING_DELTA, SIZING_H_MIN, RolloutPool, TrainingRun
from cadence.scheduler.registry import POLICIES
from cadence.scheduler.snapshot import Knobs
from cadence.sim.budgets import Budgets
from cadence.trainer.config import TrainerConfig


def longest_trajectory(pool: RolloutPool) -> int:
    """A trajectory may grow to the largest `max_model_len` of any group, then move."""
    return max(g.engine.max_model_len for g in pool.spec.groups)


def knobs_of(run: TrainingRun, pool: RolloutPool | None = None) -> Knobs:
    """The scheduler's knobs for `run` (auto floor and reserve sized as workers are), on
    `pool` (its longest trajectory) when given."""
    s = run.spec.scheduler
    return Knobs.from_spec(
        s.h_min,
        s.delta,
        sizing=(SIZING_H_MIN, SIZING_DELTA),
        eta=s.eta,
        min_decode=s.min_decode,
        concentrate_without_fresh=s.concentrate_without_fresh,
        control_period_s=s.control_period_s,
        migration=s.migration,
        max_model_len=None if pool is None else longest_trajectory(pool),
    )


def budgets_of(run: TrainingRun) -> Budgets | None:
    """Each sample's length under the run's length law; None where the model decides."""
    b = run.spec.batch
    if b.response_lengths is None:
        return None
    law = b.response_lengths.spec().build()
    return Budgets(law, b.samples_per_prompt, b.max_tokens, b.response_lengths.seed)


def trainer_config(
    run: TrainingRun, model_path: Path, state_dir: Path, policy: str | None = None
) -> TrainerConfig:
    """The trainer's settings for `run`, its model and state where the caller keeps them;
    batches taken as `policy` (default: the run's) has its trainer take them."""
    s = run.spec
    takes = getattr(POLICIES[policy or s.scheduler.policy](), "trainer_takes", None)
    return TrainerConfig(
        model_path=model_path,
        state_dir=state_dir,
        task=s.dataset.task,
        group_size=s.batch.samples_per_prompt,
        batch_groups=s.batch.prompts_per_batch,
        iterations=s.batch.iterations,
        eta=s.scheduler.eta,
        learning_rate=s.trainer.learning_rate,
        clip_eps=s.trainer.clip_eps,
        epochs=s.trainer.epochs,
        advantages=s.trainer.advantages,
        max_tokens=s.batch.max_tokens,
        temperature=s.batch.temperature,
        batches="oldest_complete" if takes == "oldest_complete" else "in_order",
    )
