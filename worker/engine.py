"""What a worker needs of its engine. Two implement it: `EmulatedEngine` (tokens from a
local model, time and KV of an emulated accelerator) and `VllmEngine` (vLLM, real)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from cadence.worker.api import DecodeSteps, Pace, Sampling, StepCostInfo


class Clock(Protocol):
    """Time as the engine sees it; tests inject a fake one."""

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline: float) -> None:
        delay = deadline - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


@dataclass
class StepTotals:
    """An engine's running sums behind `DecodeSteps`."""

    steps: int = 0
    seconds: float = 0.0
    sequences: int = 0
    context_tokens: int = 0

    def add(self, batch: int, context_tokens: int, seconds: float) -> None:
        self.steps += 1
        self.seconds += max(0.0, seconds)
        self.sequences += batch
        self.context_tokens += context_tokens

    def info(self) -> DecodeSteps:
        return DecodeSteps(
            steps=self.steps,
            seconds=self.seconds,
            sequences=self.sequences,
            context_tokens=self.context_tokens,
        )


@dataclass
class Generation:
    """What a request has produced since it was added: tokens and their logprobs."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass
class EngineRequest:
    """A sequence to decode: its whole context so far, and how many tokens to add."""

    id: str
    context_ids: list[int]
    max_new_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    eos_token_id: int | None = None
    output: Generation = field(default_factory=Generation)
    prefilled: bool = False
    preempted: bool = False  # KV given up for lack of room; waits to be prefilled again
    error: str | None = None  # the engine failed it; the sample ends marked failed
    # A move that pulls the source's KV blocks: vLLM's transfer parameters, and how many
    # context tokens the pull must leave cached here for it to count as done.
    kv_params: dict[str, object] | None = None
    kv_expected: int = 0

    @property
    def context(self) -> int:
        return len(self.context_ids) + len(self.output.token_ids)

    @property
    def token_ids(self) -> list[int]:
        """The whole sequence so far: context, then what this placement generated."""
        return self.context_ids + self.output.token_ids

    @property
    def done(self) -> bool:
        out = self.output.token_ids
        if len(out) >= self.max_new_tokens:
            return True
        return bool(out) and self.eos_token_id is not None and out[-1] == self.eos_token_id


class RoomError(RuntimeError):
    """The request's KV does not fit in what the engine has left."""


def pulled_tokens(offered: int, context: int, block: int) -> int:
    """The least a pull must leave cached on the destination to count as one: the whole
    blocks of what was offered short of the last token (vLLM loads that block too when
    it is whole, and computes the last token again for the logits it samples from)."""
    return min(offered, context - 1) // block * block


@dataclass(frozen=True, slots=True)
class PullOutcome:
    """How a KV pull ended: `cached` context tokens were found cached on this engine
    after it; a failed one (`failure` says why) was re-prefilled instead."""

    rid: str
    context: int
    cached: int
    failure: str | None = None


class Engine(Protocol):
    requests: dict[str, EngineRequest]  # resident: decoding or about to
    decoded_tokens: int
    wake: asyncio.Event  # set when work arrives, so an idle decode loop resumes

    @property
    def kind(self) -> Literal["vllm", "emulated"]: ...

    @property
    def capacity_tokens(self) -> int: ...

    @property
    def fell_behind(self) -> bool: ...

    @property
    def pace(self) -> Pace | None: ...  # an emulated engine's modelled and late seconds

    @property
    def decode_steps(self) -> DecodeSteps | None: ...  # its decode steps, timed, if it can

    @property
    def preemptions(self) -> int: ...  # residents the engine preempted for lack of KV

    @property
    def max_seqs(self) -> int | None: ...  # the engine's sequence limit, if it has one

    @property
    def step_cost(self) -> StepCostInfo | None: ...  # its decode and prefill costs, if known

    @property
    def vocab_size(self) -> int | None: ...  # token ids the model embeds, if known

    @property
    def max_model_len(self) -> int | None: ...  # positions a sequence may take, if known

    @property
    def transfer_layout(self) -> str | None: ...  # its KV layout, if it can move KV

    @property
    def kv_bytes_per_token(self) -> int: ...

    @property
    def kv_lease_s(self) -> float: ...  # how long exported blocks are held for a pull

    @property
    def kv_link_bytes_per_s(self) -> float | None: ...  # a pull's link, in engine time

    pulls: list[PullOutcome]  # pulls that ended since the worker last read them

    async def export(self, rid: str, token_ids: list[int]) -> tuple[int, dict[str, object]]:
        """Hold `token_ids`' KV blocks for a pull: (tokens held, transfer parameters)."""
        ...

    def used_tokens(self) -> int: ...

    def add(self, request: EngineRequest) -> None: ...

    def abort(self, rid: str) -> EngineRequest: ...

    async def step(self) -> list[EngineRequest]: ...

    async def load_weights(self, path: Path) -> None: ...
