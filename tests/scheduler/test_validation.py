"""Configurations that could strand a trajectory are refused with a clear error."""

from __future__ import annotations

import pytest

from cadence.scheduler import (
    ConfigError,
    Knobs,
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
    ("h_min", "delta", "eta", "min_decode", "message"),
    [
        (-1, 0, 0, 1, "h_min"),
        (0, -5, 0, 1, "delta"),
        (0, 0, -1, 1, "eta"),
        (0, 0, 0, 0, "anti-thrash"),
    ],
)
def test_bad_knobs_are_refused(
    h_min: int, delta: int, eta: int, min_decode: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Knobs(h_min=h_min, delta=delta, eta=eta, min_decode=min_decode)


def test_worker_without_capacity_is_refused() -> None:
    with pytest.raises(ConfigError, match="capacity"):
        make_worker("w", capacity=0)
