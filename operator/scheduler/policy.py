"""The interface every scheduling policy shares (Cadence and the baselines).

A policy is a pure planner: `plan(snapshot, state) -> (actions, state)`. The simulator,
`cadence run` and the operator call it the same way, as vLLM's engine calls its
scheduler and Ray autoscaler v2's reconciler calls `schedule()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from cadence.operator.scheduler.actions import Action
from cadence.operator.scheduler.snapshot import Snapshot

S = TypeVar("S")


class Policy(Protocol[S]):
    """A scheduling policy with state of type S kept between cycles by the caller."""

    @property
    def name(self) -> str: ...

    def initial_state(self) -> S: ...

    def plan(self, snapshot: Snapshot, state: S) -> tuple[Sequence[Action], S]: ...
