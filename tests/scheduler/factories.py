"""Factories for hand-built scheduler inputs, in the manner of vLLM's tests/v1/core/utils.

Each takes only what a test cares about; everything else gets a value that stays out of
the way (no floor pressure, anti-thrash satisfied, version 0).
"""

from __future__ import annotations

from collections.abc import Sequence

from cadence.scheduler import (
    Admission,
    FreshSample,
    Knobs,
    PendingTrajectory,
    Resident,
    Snapshot,
    StepCost,
    WorkerView,
)


def make_resident(id: str, context: int, decoded: int = 10_000) -> Resident:
    return Resident(id=id, context=context, decoded_since_placement=decoded)


def make_worker(
    id: str,
    capacity: int = 1_000,
    residents: Sequence[Resident | int] = (),
    version: int | None = 0,
    affinity: int = 0,
    accelerator: str = "H800",
    draining: bool = False,
    max_seqs: int | None = None,
    cost: StepCost | None = None,
) -> WorkerView:
    """A worker; `residents` may be plain context lengths, named `<worker>-r<i>`."""
    rs = [
        r if isinstance(r, Resident) else make_resident(f"{id}-r{i}", r)
        for i, r in enumerate(residents)
    ]
    return WorkerView(
        id=id,
        accelerator=accelerator,
        affinity=affinity,
        version=version,
        capacity=capacity,
        residents=tuple(rs),
        draining=draining,
        max_seqs=max_seqs,
        cost=cost,
    )


def make_cost(
    weights_ms: float = 10.0,
    kv_token_us: float = 0.0,
    seq_ms: float = 0.0,
    prefill_token_us: float = 0.0,
) -> StepCost:
    """A step cost in readable units: by default 10 ms a step whatever the batch."""
    return StepCost(
        weights_s=weights_ms / 1e3,
        kv_token_s=kv_token_us / 1e6,
        seq_s=seq_ms / 1e3,
        prefill_token_s=prefill_token_us / 1e6,
    )


def make_pending(
    id: str, context: int, version: int = 0, placeable: bool = True, since: float = 0.0
) -> PendingTrajectory:
    return PendingTrajectory(
        id=id, version=version, context=context, since=since, placeable=placeable
    )


def make_fresh(id: str, group: int = 0, prompt: int = 10) -> FreshSample:
    return FreshSample(id=id, group=group, prompt_tokens=prompt)


def make_knobs(
    h_min: int = 0, delta: int = 0, eta: int = 1, min_decode: int = 1, **kw: bool | float | str
) -> Knobs:
    return Knobs(h_min=h_min, delta=delta, eta=eta, min_decode=min_decode, **kw)  # type: ignore[arg-type]


def make_snapshot(
    workers: Sequence[WorkerView],
    pending: Sequence[PendingTrajectory] = (),
    fresh: Sequence[FreshSample] = (),
    newest: int = 0,
    knobs: Knobs | None = None,
    admitted: int | None = None,
    batch_size: int = 1,
    total_groups: int | None = None,
    now: float = 0.0,
) -> Snapshot:
    """A snapshot; by default admission is closed (everything admitted, nothing left)."""
    if total_groups is None:
        total_groups = admitted if admitted is not None else 0
    if admitted is None:
        admitted = total_groups
    return Snapshot(
        now=now,
        workers=tuple(workers),
        pending=tuple(pending),
        fresh=tuple(fresh),
        newest_version=newest,
        admission=Admission(
            groups_admitted=admitted, batch_size=batch_size, total_groups=total_groups
        ),
        knobs=knobs if knobs is not None else make_knobs(),
    )
