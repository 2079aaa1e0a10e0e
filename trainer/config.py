"""A training run's trainer settings, apart from the trainer itself: the operator and
`cadence run` build this from a TrainingRun without importing torch (`trainer.py` does)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cadence.common.limits import (
    MAX_ETA,
    MAX_ITERATIONS,
    MAX_PROMPTS_PER_BATCH,
    MAX_SAMPLES_PER_PROMPT,
)
from cadence.worker.api import MAX_TOKENS, greedy_or_above_the_floor


class TrainerConfig(BaseModel):
    """A training run's trainer side (the TrainingRun resource carries the same fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: Path
    state_dir: Path  # the ledger, published weights and optimizer state (a volume)
    # A built-in task (prompts and verifier, trained here) or "external": prompts are
    # submitted and batches trained by another trainer through the client (`client.py`).
    task: Literal["digits", "arithmetic", "external"] = "digits"
    group_size: int = Field(default=8, ge=2, le=MAX_SAMPLES_PER_PROMPT)  # samples per prompt
    batch_groups: int = Field(default=8, ge=1, le=MAX_PROMPTS_PER_BATCH)  # B
    iterations: int = Field(default=20, ge=1, le=MAX_ITERATIONS)  # batches to train
    eta: int = Field(default=1, ge=0, le=MAX_ETA)
    learning_rate: float = Field(default=2e-2, ge=0.0)
    clip_eps: float = Field(default=0.2, gt=0.0)
    epochs: int = Field(default=1, ge=1)
    advantages: Literal["group", "batch"] = "group"
    max_tokens: int = Field(default=12, ge=1, le=MAX_TOKENS)  # as a worker bounds it
    temperature: float = Field(default=1.0, ge=0.0)
    # Which groups an update trains: batch u as admitted ("in_order"), or the B groups
    # that completed first ("oldest_complete", as AReaL's trainer takes them).
    batches: Literal["in_order", "oldest_complete"] = "in_order"

    _floor = field_validator("temperature")(greedy_or_above_the_floor)

    seed: int = 0
    # Where an external trainer leaves the weights it publishes by path (a volume both
    # see); None: it publishes by http(s) URL only. No other path is read.
    publish_from: Path | None = None
