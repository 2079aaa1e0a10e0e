"""The interface every scheduling policy shares (Cadence and the baselines).

A policy is a pure planner: `plan(snapshot, state) -> (actions, state)`. The simulator,
`cadence run` and the operator call it the same way, as vLLM's engine calls its
scheduler and Ray autoscaler v2's reconciler calls `schedule()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from cadence.scheduler.actions import Action
from cadence.scheduler.snapshot import Snapshot

S = TypeVar("S")


class Policy(Protocol[S]):
    """A scheduling policy with state of type S kept between cycles by the caller."""

    @property
    def name(self) -> str: ...

    def initial_state(self) -> S: ...

    def staleness_bound(self, eta: int) -> int:
        """The most versions a sample's batch may run ahead of the version it starts on,
        given the run's `eta`: `eta` for every policy that honours it, a policy's own bound
        otherwise (Sync 0, One-off 1, `laminar-native` 4). Reports put it beside each row
        so policies are compared at equal staleness."""
        ...

    def plan(self, snapshot: Snapshot, state: S) -> tuple[Sequence[Action], S]: ...
