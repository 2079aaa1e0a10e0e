"""Configurations that could strand a trajectory are refused with a clear error."""

from __future__ import annotations

import pytest

from cadence.operator.scheduler import (
    ConfigError,
    StrandingError,
    check_no_stranding,
    required_capacity,
)

from .factories import make_knobs, make_worker


def test_group_too_small_for_a_full_length_trajectory_is_refused() -> None:
    knobs = make_knobs(h_min=1000, delta=512)
    assert required_capacity(16384, knobs) == 17896
    check_no_stranding({"h800": 200_000, "a910x": 17896}, 16384, knobs)
    with pytest.raises(StrandingError, match=r"a910x \(17895 tokens\)"):
        check_no_stranding({"h800": 200_000, "a910x": 17895}, 16384, knobs)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("h_min", -1, "h_min"),
        ("delta", -5, "delta"),
        ("eta", -1, "eta"),
        ("min_decode", 0, "anti-thrash"),
    ],
)
def test_bad_knobs_are_refused(field: str, value: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_knobs(**{field: value})  # type: ignore[arg-type]


def test_worker_without_capacity_is_refused() -> None:
    with pytest.raises(ConfigError, match="capacity"):
        make_worker("w", capacity=0)
