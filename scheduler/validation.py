"""Refuse, before a run starts, a pool on which some trajectory could never be placed.

A trajectory may reach `max_model_len` tokens. If some group's workers cannot hold one
that long above `h_min + delta` even when it is alone, a trajectory of a version that only
such workers serve could be stranded in P_v for ever (docs/architecture.md, "Headroom and
thresholds"), so the configuration is invalid.
"""

from __future__ import annotations

from collections.abc import Mapping

from cadence.scheduler.errors import StrandingError
from cadence.scheduler.snapshot import Knobs


def required_capacity(max_model_len: int, knobs: Knobs) -> int:
    """The KV capacity (tokens) every worker needs: max_model_len + h_min + delta."""
    return max_model_len + knobs.h_min + knobs.delta


def check_no_stranding(capacities: Mapping[str, int], max_model_len: int, knobs: Knobs) -> None:
    """Raise StrandingError naming each group whose KV capacity is too small.

    `capacities` maps a group name to its workers' KV capacity in tokens.
    """
    if max_model_len < 1:
        raise StrandingError(f"max_model_len is {max_model_len}; it must be >= 1")
    need = required_capacity(max_model_len, knobs)
    short = {name: cap for name, cap in sorted(capacities.items()) if cap < need}
    if short:
        listed = ", ".join(f"{name} ({cap} tokens)" for name, cap in short.items())
        raise StrandingError(
            f"KV capacity below max_model_len + h_min + delta = {max_model_len} + "
            f"{knobs.h_min} + {knobs.delta} = {need} tokens in group(s) {listed}: "
            "a trajectory that long could never be placed there"
        )
