"""The rule across a pool and a run: every group holds the longest trajectory above
`h_min + delta`, at its tensor-parallel degree or the smallest that fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence.common.catalog import ACCELERATORS
from cadence.operator.api.capacity import check_capacity, group_capacities, hourly_price
from cadence.operator.api.files import load
from cadence.operator.api.resources import ResourceError
from cadence.operator.api.settings import knobs_of
from tests.helpers import TRAINING_RUN

EXAMPLE = TRAINING_RUN
# Pods that can hold a larger degree than the example's one device each.
EIGHT_DEVICES = (
    ('{nvidia.com/gpu: "1"}', '{nvidia.com/gpu: "8"}'),
    ('{huawei.com/Ascend910: "1"}', '{huawei.com/Ascend910: "8"}'),
)


def _load(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    text = EXAMPLE.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new, 1)
    (tmp_path / "run.yaml").write_text(text)
    return tmp_path / "run.yaml"


def test_a_group_sizes_itself_to_hold_the_longest_trajectory(tmp_path: Path) -> None:
    pool, run = load(EXAMPLE)
    small = group_capacities(pool, run)
    assert small["h800"] > small["a910x"] > 4096 + 256 + 16  # H800 has more memory
    # A longer max_model_len than one device of Qwen3-32B holds: the group takes more,
    # up to the devices its pods request.
    longer = _load(
        tmp_path,
        ("catalog: Qwen3-8B", "catalog: Qwen3-32B"),
        *EIGHT_DEVICES,
        (
            "replicas: 2\n      pricePerHour: 1.2",
            "replicas: 2\n      engine: {maxModelLen: 200000}\n      pricePerHour: 1.2",
        ),
    )
    pool, run = load(longer)
    sized = group_capacities(pool, run)
    assert min(sized.values()) >= 200_000 + 256 + 16


def test_a_group_pinned_too_small_is_refused_naming_it(tmp_path: Path) -> None:
    bad = _load(
        tmp_path,
        ("catalog: Qwen3-8B", "catalog: Qwen3-32B"),
        *EIGHT_DEVICES,
        (
            "replicas: 2\n      pricePerHour: 1.2",
            "replicas: 2\n      engine: {tensorParallel: 1, maxModelLen: 200000}\n"
            "      pricePerHour: 1.2",
        ),
    )
    with pytest.raises(ResourceError) as e:
        load(bad)
    message = str(e.value)
    assert message.startswith("TrainingRun spec.model: Qwen3-32B on this pool: KV capacity")
    assert "a910x (" in message and "h800" not in message  # the H800 group sizes itself
    pool, run = load(EXAMPLE)
    check_capacity(pool, run)  # the example fits: no error


def test_every_scheduler_knob_of_the_run_reaches_the_policy(tmp_path: Path) -> None:
    edited = _load(
        tmp_path, ("    hMin: auto\n", "    hMin: 300\n    concentrateWithoutFresh: true\n")
    )
    _, run = load(edited)
    knobs = knobs_of(run)
    assert (knobs.h_min, knobs.delta, knobs.eta) == (300, 16, 1)
    assert (knobs.auto_h_min, knobs.auto_delta) == (False, True)
    assert knobs.control_period_s == run.spec.scheduler.control_period_s
    assert knobs.concentrate_without_fresh
    example = knobs_of(load(EXAMPLE)[1])
    assert not example.concentrate_without_fresh
    assert example.auto_h_min and example.auto_delta  # the example leaves both auto


def test_a_pinned_floor_that_does_not_fit_is_blamed_not_the_model(tmp_path: Path) -> None:
    bad = _load(
        tmp_path,
        ("    hMin: auto\n", "    hMin: 300000\n"),
        (
            "replicas: 2\n      pricePerHour: 1.2",
            "replicas: 2\n      engine: {tensorParallel: 1}\n      pricePerHour: 1.2",
        ),
    )
    with pytest.raises(ResourceError) as e:
        load(bad)
    assert str(e.value).startswith("TrainingRun spec.scheduler.hMin: ")


def test_a_worker_costs_its_groups_price_else_the_catalogs() -> None:
    """The operator's tok/$ and `cadence run`'s price a worker alike: its group's
    `pricePerHour`, else the catalog's list price for the accelerator."""
    pool, _ = load(EXAMPLE)
    group = pool.spec.groups[0]
    listed = ACCELERATORS[group.accelerator].price_per_hour
    assert listed is not None
    unset = group.model_copy(update={"price_per_hour": None})
    assert hourly_price(unset) == listed.value > 0
    assert hourly_price(group.model_copy(update={"price_per_hour": 3.5})) == 3.5
