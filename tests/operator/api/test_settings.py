"""What a TrainingRun tells the trainer (`settings.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence.operator.api.files import load
from cadence.operator.api.settings import trainer_config
from tests.helpers import LONGTAIL


@pytest.mark.parametrize(
    ("policy", "batches"),
    [(None, "in_order"), ("laminar", "in_order"), ("areal", "oldest_complete")],
)
def test_the_trainer_takes_its_batches_as_the_runs_policy_would(
    policy: str | None, batches: str
) -> None:
    """AReaL's trainer trains the groups that completed first; every other policy's
    trains batch u as it was admitted. `cadence run --policy` overrides the file's."""
    _, run = load(LONGTAIL)
    config = trainer_config(run, Path("/models/m"), Path("/state"), policy)
    assert config.batches == batches
    assert (config.group_size, config.batch_groups) == (8, 8)
