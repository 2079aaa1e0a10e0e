"""Policies by the names the command line and the resources use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cadence.operator.scheduler.baselines.areal import areal
from cadence.operator.scheduler.baselines.dora import dora
from cadence.operator.scheduler.baselines.laminar import laminar
from cadence.operator.scheduler.baselines.sync import one_off, sync
from cadence.operator.scheduler.cadence import CadencePolicy
from cadence.operator.scheduler.policy import Policy

POLICIES: dict[str, Callable[[], Policy[Any]]] = {
    "cadence": CadencePolicy,
    "sync": sync,
    "one-off": one_off,
    "areal": areal,
    "laminar": laminar,
    "dora": dora,
}
