"""What a policy asks the caller to do; the caller applies these through worker endpoints.

Every action is a plain frozen value. A plan lists actions in the order they were
decided, and the caller applies them in that order: an eviction always comes before the
placement it made room for.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class EvictReason(StrEnum):
    """Why a resident departs; reported in metrics and checked by the property tests."""

    FLOOR = "floor"  # headroom fell below h_min
    SOURCE = "source"  # the concentration source departing its residents
    MAKE_ROOM = "make_room"  # a concentration target making room for a longer trajectory
    LIFT = "lift"  # work conservation: a tail trajectory moving up to a faster worker
    INTERRUPT = "interrupt"  # a baseline interrupting in-flight work for new weights (AReaL)
    REPACK = "repack"  # a baseline consolidating a draining replica onto another (Laminar)


@dataclass(frozen=True, slots=True)
class Evict:
    """Depart `trajectory` from `worker` into P_v (its tokens stay parked on `worker`)."""

    trajectory: str
    worker: str
    context: int
    reason: EvictReason


@dataclass(frozen=True, slots=True)
class Place:
    """Start or resume `trajectory` on `worker`, which serves `version`.

    A fresh sample is bound to `version` by this placement.
    """

    trajectory: str
    worker: str
    version: int
    context: int


@dataclass(frozen=True, slots=True)
class Advance:
    """Switch the empty `worker` to policy `version`."""

    worker: str
    version: int


@dataclass(frozen=True, slots=True)
class Admit:
    """Admit the next `groups` prompt groups from the dataset cursor."""

    groups: int


Action = Evict | Place | Advance | Admit
