"""What a worker needs of its engine. Two implement it: `EmulatedEngine` (tokens from a
local model, time and KV of an emulated accelerator) and `VllmEngine` (vLLM, real)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal, Protocol

from cadence.worker.api import StepCostInfo
from cadence.worker.emulated import EngineRequest


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
    def preemptions(self) -> int: ...  # residents the engine preempted for lack of KV

    @property
    def max_seqs(self) -> int | None: ...  # the engine's sequence limit, if it has one

    @property
    def step_cost(self) -> StepCostInfo | None: ...  # its decode and prefill costs, if known

    def used_tokens(self) -> int: ...

    def add(self, request: EngineRequest) -> None: ...

    def abort(self, rid: str) -> EngineRequest: ...

    async def step(self) -> list[EngineRequest]: ...

    async def load_weights(self, path: Path) -> None: ...
