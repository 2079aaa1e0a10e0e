"""A worker's state as progress on the last whole state a reader has.

Between two control periods most workers only decode: every resident grows by the
tokens it decoded, the KV in use grows with them, and nothing else changes. A host of
hundreds of workers that sends every state whole moves megabytes a period, and the
control loop spends most of its period validating them. So a host sends a worker whole
only when more than that changed (a placement, an eviction, a delivery, a version, a
lease), and otherwise its progress: one number per resident (`WorkerProgress`).

`progress_of` is the host's side: the progress from the whole state it last sent to
the state now, or None where that cannot say it. `advanced` is the reader's: the state
now, from the whole state and the progress; `advanced(base, progress_of(base, now))` is
`now` whenever the progress exists (tests/worker/test_state_progress.py).
"""

from __future__ import annotations

from typing import NamedTuple

from cadence.worker.api import ResidentInfo, WorkerProgress, WorkerState

# What a progress answer carries; any other field that differs makes the state whole.
_PROGRESS = frozenset({"kv_used_tokens", "headroom_tokens", "pace", "decode_steps", "residents"})
_SHAPE = tuple(f for f in WorkerState.model_fields if f not in _PROGRESS)


def progress_of(base: WorkerState, now: WorkerState) -> WorkerProgress | None:
    """`now` as progress on `base`, or None where it is not only progress."""
    if len(base.residents) != len(now.residents):
        return None
    if now.headroom_tokens != now.kv_capacity_tokens - now.kv_used_tokens:
        return None  # `advanced` derives the headroom
    if any(getattr(base, f) != getattr(now, f) for f in _SHAPE):
        return None
    decoded = []
    for b, n in zip(base.residents, now.residents, strict=True):
        d = n.decoded_since_placement - b.decoded_since_placement
        if (
            d < 0
            or n.context - b.context != d
            or n.generated - b.generated != d
            or (n.id, n.attempt, n.version, n.state) != (b.id, b.attempt, b.version, b.state)
        ):
            return None
        decoded.append(d)
    return WorkerProgress(
        kv_used_tokens=now.kv_used_tokens,
        decoded=decoded,
        pace=now.pace,
        decode_steps=now.decode_steps,
    )


def advanced(base: WorkerState, progress: WorkerProgress) -> WorkerState:
    """The state `progress` says, on `base` (the whole state it was computed against)."""
    if len(progress.decoded) != len(base.residents):
        raise ValueError(
            f"progress of {len(progress.decoded)} residents for worker {base.worker_id}, "
            f"which had {len(base.residents)}"
        )
    residents = [
        ResidentInfo.model_construct(
            id=r.id,
            attempt=r.attempt,
            version=r.version,
            context=r.context + d,
            generated=r.generated + d,
            decoded_since_placement=r.decoded_since_placement + d,
            state=r.state,
        )
        for r, d in zip(base.residents, progress.decoded, strict=True)
    ]
    return base.model_copy(
        update={
            "residents": residents,
            "kv_used_tokens": progress.kv_used_tokens,
            "headroom_tokens": base.kv_capacity_tokens - progress.kv_used_tokens,
            "pace": progress.pace,
            "decode_steps": progress.decode_steps,
        }
    )


class Observed(NamedTuple):
    """A worker as a reader last saw it: the last whole state it received, and the
    progress on that state since (None: the whole state is current)."""

    whole: WorkerState
    progress: WorkerProgress | None = None

    def current(self) -> WorkerState:
        return self.whole if self.progress is None else advanced(self.whole, self.progress)
