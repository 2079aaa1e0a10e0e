"""Policies by the names the command line and the resources use, and the settings each
baseline's unknown parameters are swept over (docs/concepts.md, "The baselines": where a
source leaves a parameter unknown, the comparison takes the baseline at its best
setting)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from cadence.scheduler.baselines.areal import ArealPolicy
from cadence.scheduler.baselines.dora import DoraPolicy
from cadence.scheduler.baselines.laminar import LaminarPolicy
from cadence.scheduler.baselines.sync import one_off, sync
from cadence.scheduler.cadence import CadencePolicy
from cadence.scheduler.policy import Policy

POLICIES: dict[str, Callable[..., Policy[Any]]] = {
    "cadence": CadencePolicy,
    "sync": sync,
    "one-off": one_off,
    "areal": ArealPolicy,
    "laminar": LaminarPolicy,
    "dora": DoraPolicy,
    # Laminar as its paper ran it: no configured bound, observed at most 4 versions ahead.
    "laminar-native": partial(LaminarPolicy, max_staleness=4, name="laminar-native"),
}

# What `cadence sim` runs when no policy is named: one row per policy, each held to the
# scenario's eta. Variants with a bound of their own are named explicitly.
DEFAULT_POLICIES: tuple[str, ...] = ("cadence", "sync", "one-off", "areal", "laminar", "dora")

SWEEPS: dict[str, Sequence[Mapping[str, Any]]] = {
    "areal": [{"max_concurrent": n} for n in (1024, 2048, 4096, None)],
    "laminar": [
        {"prompts_per_take": take, "decode_batch_bound": bound}
        for take in (2, 4, 8)
        for bound in (64, 128, 256)
    ],
    "dora": [{"rebalance_period_s": p} for p in (10.0, 30.0, 120.0)],
}
SWEEPS["laminar-native"] = SWEEPS["laminar"]
