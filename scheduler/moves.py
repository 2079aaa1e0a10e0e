"""What moving a departed trajectory to a worker is, and what it costs.

A departed trajectory's state stays parked on its source (docs/architecture.md, "Where token state
lives"); a placement elsewhere either pulls its KV blocks from the source, which only a
worker of the source's transfer group can do (same model, dtype, block size, parallel
layout and accelerator type), or re-prefills its whole context on the destination. A
placement back onto the worker holding it is local: nothing crosses a link, and the
engine rebuilds what its cache dropped (priced as a re-prefill there, the most it costs).

The migration knob chooses between them (`Migration`): auto pulls wherever the pair's
groups match and re-prefills otherwise; kv moves a departed trajectory only to a worker
that can pull it, unless no worker of its source's group serves its version (the source
is gone, or the group has left the version), since nothing may be stranded; reprefill
never pulls. The simulator charges a move by this same rule (`move_kind`), so what the
scheduler prefers is what the simulator pays.

Costs are seconds. A pull takes context x KV bytes per token / link bytes per second,
from the snapshot's `Transfer`; it delays only the moved trajectory. A re-prefill takes
the destination's prefill of the whole context (`StepCost.prefill_s`), during which every
resident there waits. With no `Transfer` a pull costs 0 and with no prefill term a
re-prefill costs infinity: kinds alone then decide, a pull before a re-prefill.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from cadence.scheduler.cost import StepCost
from cadence.scheduler.snapshot import (
    Migration,
    PendingTrajectory,
    Snapshot,
    Transfer,
    WorkerView,
)

MoveKind = Literal["local", "kv", "reprefill"]

# Preference by kind, lowest first: a pull leaves the destination's engine alone; a local
# restart and a re-prefill both recompute the context there.
_RANK: dict[MoveKind, int] = {"kv": 0, "local": 1, "reprefill": 1}

__all__ = ["Move", "MoveKind", "MoveRule", "Transfer", "move_cost_s", "move_kind"]


def move_kind(
    migration: Migration,
    parked_on: str | None,
    source_group: str | None,
    destination: str,
    destination_group: str | None,
) -> MoveKind:
    """The kind of placing a trajectory parked on `parked_on` (whose transfer group is
    `source_group`) onto `destination`: local, a KV pull, or a re-prefill."""
    if parked_on is not None and parked_on == destination:
        return "local"
    if (
        migration != "reprefill"
        and parked_on is not None
        and source_group is not None
        and source_group == destination_group
    ):
        return "kv"
    return "reprefill"


def move_cost_s(
    kind: MoveKind, context: int, destination: StepCost | None, transfer: Transfer | None
) -> float:
    """Seconds a move of `context` tokens takes: a pull over the link, else a prefill of
    the whole context on the destination (infinite when its prefill cost is unknown)."""
    if kind == "kv":
        return 0.0 if transfer is None else transfer.pull_s(context)
    if destination is None or destination.prefill_token_s <= 0.0:
        return math.inf
    return destination.prefill_s(context)


@dataclass(frozen=True, slots=True)
class Move:
    """One candidate move: its kind and what it costs in seconds."""

    kind: MoveKind
    seconds: float

    def key(self) -> tuple[int, float]:
        """Preference order, lowest first: a pull before a re-prefill, then the cheaper."""
        return (_RANK[self.kind], self.seconds)

    def stalled_s(self, residents: int) -> float:
        """Seconds of decode the move takes from trajectories: a pull delays only the
        moved one; a re-prefill (or local restart) stalls the destination's `residents`
        and the moved one."""
        if self.kind == "kv":
            return self.seconds
        return self.seconds * (residents + 1)


NO_MOVE = Move("kv", 0.0)  # a fresh sample: nothing to move, ranks with the best


class MoveRule:
    """The move rule over one snapshot: kinds, costs and the kv knob's restriction.

    `hosts` are the workers that can take a placement this cycle (the policy knows: not
    draining, not a departure-only source, not advancing); by default every worker that
    is not draining and holds weights. A departed trajectory is restricted (kv only) to
    its source's group while some host of that group serves its version.
    """

    __slots__ = ("_groups", "_hosting", "migration", "transfer")

    def __init__(self, snapshot: Snapshot, hosts: Iterable[WorkerView] | None = None) -> None:
        self.migration: Migration = snapshot.knobs.migration
        self.transfer = snapshot.transfer
        self._groups = {w.id: w.transfer_group for w in snapshot.workers}
        if hosts is None:
            hosts = (w for w in snapshot.workers if not w.draining and w.version is not None)
        self._hosting = {
            (w.version, w.transfer_group) for w in hosts if w.transfer_group is not None
        }

    def group_of(self, worker: str | None) -> str | None:
        return None if worker is None else self._groups.get(worker)

    def of(self, p: PendingTrajectory, destination: WorkerView) -> Move:
        kind = move_kind(
            self.migration,
            p.parked_on,
            self.group_of(p.parked_on),
            destination.id,
            destination.transfer_group,
        )
        return Move(kind, move_cost_s(kind, p.context, destination.cost, self.transfer))

    def between(self, context: int, source: WorkerView, destination: WorkerView) -> Move:
        """A resident of `source` moved to `destination` in one plan (its source is alive)."""
        kind = move_kind(
            self.migration, source.id, source.transfer_group, destination.id,
            destination.transfer_group,
        )  # fmt: skip
        return Move(kind, move_cost_s(kind, context, destination.cost, self.transfer))

    def restriction(self, p: PendingTrajectory) -> str | None:
        """Under kv, the transfer group `p` must be placed in; None when it may go anywhere
        (auto, reprefill, no source in the snapshot, or no host of the group serves its
        version: nothing may be stranded)."""
        if self.migration != "kv":
            return None
        group = self.group_of(p.parked_on)
        if group is None or (p.version, group) not in self._hosting:
            return None
        return group

    def restricts_from(self, source: WorkerView, version: int) -> str | None:
        """The same restriction for a resident leaving `source` in this plan."""
        if self.migration != "kv" or source.transfer_group is None:
            return None
        if (version, source.transfer_group) not in self._hosting:
            return None
        return source.transfer_group

    def allowed(self, p: PendingTrajectory, destination: WorkerView) -> bool:
        group = self.restriction(p)
        return (
            group is None or destination.transfer_group == group or (destination.id == p.parked_on)
        )
