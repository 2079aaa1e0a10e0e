"""What a worker holds of a trajectory (`Held`, resident or parked), who the worker is,
how it refuses a request, and how it reaches a peer or the trainer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cadence.worker.api import (
    ClaimRequest,
    ParkReason,
    ReleaseRequest,
    Sampling,
    Source,
    Timings,
    TrajectoryState,
    Turn,
)


class Refused(Exception):
    """A request this worker will not carry out; `status` is the HTTP status to answer."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Identity:
    worker_id: str
    accelerator: str
    affinity: int


@dataclass
class Held:
    """A trajectory's token state while this worker holds it, resident or parked."""

    id: str
    attempt: int
    version: int
    prompt_token_ids: list[int]
    turns: list[Turn]
    sampling: Sampling
    max_tokens: int
    tool_calls_left: int
    timings: Timings
    generated_at_placement: int = 0
    reason: ParkReason = "evicted"
    parked_since: float | None = None
    arrived_at: float | None = None  # when this worker took it, on its clock
    lease: tuple[str, int, float] | None = None  # (destination, attempt, until)
    scanned: int = 0  # tokens of this placement's output already searched for a tool call

    @property
    def context_ids(self) -> list[int]:
        ids = list(self.prompt_token_ids)
        for turn in self.turns:
            ids += turn.token_ids
        return ids

    @property
    def generated(self) -> int:
        return sum(len(t.token_ids) for t in self.turns if t.role == "model")

    def since_observation(self, limit: int | None = None) -> list[int]:
        """The model's tokens after the last observation (the last `limit` of them)."""
        tail: list[int] = []
        for turn in reversed(self.turns):
            if turn.role == "environment" or (limit is not None and len(tail) >= limit):
                break
            tail = turn.token_ids + tail
        return tail if limit is None else tail[-limit:]

    def timings_at(self, now: float | None) -> Timings:
        """Its timings, with the time parked here so far counted as pending."""
        if now is None or self.parked_since is None:
            return self.timings
        pending = self.timings.pending_s + now - self.parked_since
        return self.timings.model_copy(update={"pending_s": pending})

    def leaving(self, now: float) -> Timings:
        """Its timings as it leaves this worker (handed over or delivered): the time
        parked here counted as pending, the time held here added to its elapsed time."""
        timings = self.timings_at(now)
        if self.arrived_at is None:
            return timings
        elapsed = timings.elapsed_s + max(0.0, now - self.arrived_at)
        return timings.model_copy(update={"elapsed_s": elapsed})

    def to_state(self, now: float | None = None) -> TrajectoryState:
        """The state to hand over; time parked here so far counts as pending, and time
        held here as elapsed."""
        timings = self.timings_at(now) if now is None else self.leaving(now)
        return TrajectoryState(
            id=self.id,
            attempt=self.attempt,
            version=self.version,
            prompt_token_ids=self.prompt_token_ids,
            turns=self.turns,
            sampling=self.sampling,
            max_tokens=self.max_tokens,
            tool_calls_left=self.tool_calls_left,
            timings=timings,
        )

    @staticmethod
    def of(state: TrajectoryState, attempt: int) -> Held:
        return Held(
            state.id,
            attempt,
            state.version,
            list(state.prompt_token_ids),
            list(state.turns),
            state.sampling,
            state.max_tokens,
            state.tool_calls_left,
            state.timings,
            generated_at_placement=state.generated,
        )


# Where a version's weights come from: the trainer, a peer, or a path.
FetchWeights = Callable[[str], Awaitable[bytes]]

# How a destination reaches the worker a trajectory is parked on (HTTP in the service,
# a direct call in tests).
Claim = Callable[[Source, str, ClaimRequest], Awaitable[TrajectoryState]]
Release = Callable[[Source, str, ReleaseRequest], Awaitable[None]]
