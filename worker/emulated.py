"""The emulated engine: a first-class backend for machines without the accelerator a pool
describes. It is never presented as vLLM: every state and metric names it `emulated`.

Tokens come from a `TokenSource` (a small local model, so what it generates can be
trained on); time comes from the simulator's roofline of the accelerator it emulates
(`cadence.common.physics.Deployment`), divided by a time-compression factor, and KV is
accounted in tokens against that accelerator's capacity for the modelled model. So an
emulated A910X and an emulated H800 holding the same batch take steps whose durations
stand in the roofline's ratio, on one laptop.

Pacing is honest: each step has a deadline (the previous one plus the modelled step
time). When producing the tokens took longer than that, the engine does not stretch
modelled time silently; it counts the lag and reports `fell_behind`, so a run on an
overloaded host says so instead of distorting every latency it measures.

KV transfer is emulated too: workers of one model, accelerator type and tensor-parallel
degree form a transfer group, and a move between two of them costs the KV's bytes over
`link_bytes_per_s` (the modelled cluster link) instead of a prefill of its context, as
the simulator charges it. The tokens themselves travel in the claim either way; no pull
can fail here, so failed pulls are vLLM's to show.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from cadence.common.physics import LINK_BYTES_PER_S, Deployment, transfer_s
from cadence.worker.api import DecodeSteps, Pace, StepCostInfo
from cadence.worker.engine import (
    Clock,
    EngineRequest,
    MonotonicClock,
    PullOutcome,
    RoomError,
    StepTotals,
)


@dataclass(frozen=True, slots=True)
class Sampled:
    token: int
    logprob: float


class TokenSource(Protocol):
    """Produces the next token of each request in a batch. It may cache per request id;
    `forget` tells it a request left (finished, evicted), so its cache can go."""

    def next_tokens(self, batch: Sequence[EngineRequest]) -> list[Sampled]: ...

    def forget(self, rid: str) -> None: ...

    def load_weights(self, path: Path) -> None: ...

    @property
    def vocab_size(self) -> int | None: ...  # token ids it can read, if it knows

    # A source may also have `max_model_len`, the positions its model embeds.


@dataclass
class Pacer:
    """Deadlines for the steps of one emulated worker, and an account of lateness."""

    deployment: Deployment
    clock: Clock
    compression: float = 1.0
    # Lateness under this is scheduling noise, not falling behind.
    slack_s: float = 0.005
    deadline: float | None = None
    late_steps: int = 0
    lag_s: float = 0.0  # total time the host ran past its deadlines
    steps: int = 0
    scheduled_s: list[float] = field(default_factory=list)  # the last few step durations
    scheduled_total_s: float = 0.0  # modelled time of every step so far
    started: float = 0.0  # when the current step began: the last one's end, or now

    def __post_init__(self) -> None:
        if self.compression <= 0:
            raise ValueError("time compression must be positive")

    def step_s(self, batch: int, resident_tokens: int) -> float:
        """Wall seconds one decode step of this batch takes on the emulated accelerator."""
        return self.deployment.decode_step_s(batch, resident_tokens) / self.compression

    def prefill_s(self, tokens: int) -> float:
        return self.deployment.prefill_s(tokens) / self.compression

    def begin(self, duration: float) -> float:
        """Schedule the next step of `duration` seconds; returns its deadline."""
        start = self.clock.now() if self.deadline is None else self.deadline
        self.started = start
        self.deadline = start + duration
        self.steps += 1
        self.scheduled_total_s += duration
        self.scheduled_s.append(duration)
        del self.scheduled_s[:-64]
        return self.deadline

    async def finish(self) -> None:
        """Wait for the current step's deadline, or record that the host missed it."""
        assert self.deadline is not None
        late = self.clock.now() - self.deadline
        if late > self.slack_s:
            self.late_steps += 1
            self.lag_s += late
            self.deadline = self.clock.now()  # keep pace from here, not from the past
            return
        await self.clock.sleep_until(self.deadline)

    def idle(self) -> None:
        """No work: the next step starts when it is scheduled, not back-to-back."""
        self.deadline = None

    @property
    def fell_behind(self) -> bool:
        return self.late_steps > 0


class EmulatedEngine:
    """Decodes with a `TokenSource`, paced and sized as the emulated accelerator.

    `add` admits a request only when its context fits the capacity left. The control
    loop's headroom floor keeps growth room; if residents outgrow the cache anyway, the
    newest is preempted as vLLM preempts (its KV freed, recomputed by a prefill once room
    returns) and counted in `preemptions`. `step` runs one decode step of every running
    resident and returns the requests that finished.
    """

    kind: Literal["emulated"] = "emulated"

    def __init__(
        self,
        deployment: Deployment,
        source: TokenSource,
        *,
        clock: Clock | None = None,
        compression: float = 1.0,
        max_batch: int = 256,
        link_bytes_per_s: float | None = LINK_BYTES_PER_S,
    ) -> None:
        self.deployment = deployment
        self.link_bytes_per_s = link_bytes_per_s
        self.pulls: list[PullOutcome] = []
        self.source = source
        self.clock = clock or MonotonicClock()
        self.pacer = Pacer(deployment, self.clock, compression)
        self.max_batch = max_batch
        self.requests: dict[str, EngineRequest] = {}
        self.decoded_tokens = 0
        self.preemptions = 0
        self.totals = StepTotals()  # its prefills are steps of their own, not counted
        self.wake = asyncio.Event()

    @property
    def capacity_tokens(self) -> int:
        return self.deployment.kv_capacity_tokens

    @property
    def vocab_size(self) -> int | None:
        return self.source.vocab_size

    @property
    def max_model_len(self) -> int | None:
        return getattr(self.source, "max_model_len", None)

    @property
    def max_seqs(self) -> int:
        return self.max_batch

    @property
    def transfer_layout(self) -> str | None:
        """Model, accelerator type and tensor-parallel degree; None: no KV link."""
        if self.link_bytes_per_s is None:
            return None
        d = self.deployment
        return f"{d.model.name}|{d.accelerator.name}|tp {d.tp}"

    @property
    def kv_bytes_per_token(self) -> int:
        return int(self.deployment.model.kv_bytes_per_token)

    @property
    def kv_lease_s(self) -> float:
        return 30.0

    @property
    def kv_link_bytes_per_s(self) -> float | None:
        if self.link_bytes_per_s is None:
            return None
        return self.link_bytes_per_s * self.pacer.compression

    async def export(self, rid: str, token_ids: list[int]) -> tuple[int, dict[str, object]]:
        if self.link_bytes_per_s is None:
            raise RuntimeError("this engine emulates no KV link")
        return len(token_ids), {"emulated": True}

    def _load_s(self, r: EngineRequest) -> float:
        """A new arrival's time to its first step: its pull over the link, or its prefill."""
        if r.kv_params is None or self.link_bytes_per_s is None:
            return self.pacer.prefill_s(r.context)
        self.pulls.append(PullOutcome(r.id, r.context, r.context))
        r.kv_params = None  # pulled once; a preemption later recomputes, as in vLLM
        assert self.kv_link_bytes_per_s is not None
        return transfer_s(r.context, self.deployment.model, self.kv_link_bytes_per_s)

    @property
    def step_cost(self) -> StepCostInfo:
        """The emulated accelerator's roofline, in this host's (compressed) seconds."""
        cost, k = self.deployment.step_terms(), self.pacer.compression
        return StepCostInfo(
            weights_s=cost.weights_s / k,
            kv_token_s=cost.kv_token_s / k,
            seq_s=cost.seq_s / k,
            overhead_s=cost.overhead_s / k,
            prefill_token_s=cost.prefill_token_s / k,
        )

    @property
    def fell_behind(self) -> bool:
        return self.pacer.fell_behind

    @property
    def pace(self) -> Pace | None:
        return Pace(modelled_s=self.pacer.scheduled_total_s, late_s=self.pacer.lag_s)

    @property
    def decode_steps(self) -> DecodeSteps | None:
        return self.totals.info()

    def used_tokens(self) -> int:
        return sum(r.context for r in self.requests.values() if not r.preempted)

    def add(self, request: EngineRequest) -> None:
        if request.id in self.requests:
            raise ValueError(f"{request.id} is already resident")
        if len(self.requests) >= self.max_batch:
            raise RoomError(f"the batch is full ({self.max_batch} residents)")
        if self.used_tokens() + request.context > self.capacity_tokens:
            raise RoomError(
                f"{request.context} tokens do not fit: {self.capacity_tokens - self.used_tokens()}"
                " left"
            )
        self.requests[request.id] = request
        self.wake.set()

    def _preempt_while_over(self) -> None:
        running = [r for r in self.requests.values() if not r.preempted]
        for r in reversed(running[1:]):  # the newest first; the oldest always runs
            if self.used_tokens() <= self.capacity_tokens:
                return
            if not r.done:
                r.preempted = True
                self.preemptions += 1
                self.source.forget(r.id)

    async def load_weights(self, path: Path) -> None:
        """Serve a new policy version; only when nothing is resident."""
        if self.requests:
            raise RuntimeError("weights change only on an empty engine")
        await asyncio.to_thread(self.source.load_weights, path)

    def abort(self, rid: str) -> EngineRequest:
        """Stop decoding `rid` and free its KV; the request keeps what it generated."""
        self.source.forget(rid)
        return self.requests.pop(rid)

    async def step(self) -> list[EngineRequest]:
        """One engine step: prefill new arrivals (their time first), then decode one token
        for every resident. Returns the requests that finished, removed."""
        if not self.requests:
            self.pacer.idle()
            return []
        for r in self.requests.values():  # the oldest preempted first, as room returns
            if r.preempted and self.used_tokens() + r.context <= self.capacity_tokens:
                r.preempted, r.prefilled = False, False
        running = [r for r in self.requests.values() if not r.preempted]
        fresh = [r for r in running if not r.prefilled]
        if fresh:
            self.pacer.begin(sum(self._load_s(r) for r in fresh))
            for r in fresh:
                r.prefilled = True
            await self.pacer.finish()
        batch = running
        if not batch:  # cannot happen while one running request is never preempted
            return []
        context = self.used_tokens()
        self.pacer.begin(self.pacer.step_s(len(batch), context))
        # Off the event loop, so the API answers while a step computes; a request evicted
        # meanwhile keeps what it had when it left, and this step's token for it is void.
        sampled = await asyncio.to_thread(self.source.next_tokens, batch)
        stepped = []
        for r, s in zip(batch, sampled, strict=True):
            if self.requests.get(r.id) is r:
                r.output.token_ids.append(s.token)
                r.output.logprobs.append(s.logprob)
                stepped.append(r)
        self.decoded_tokens += len(stepped)
        self._preempt_while_over()
        await self.pacer.finish()
        self.totals.add(len(batch), context, self.clock.now() - self.pacer.started)
        # A request evicted while the step's time passed went to whoever evicted it, with
        # what it had: it is theirs to end, not this step's (ended twice, or a KeyError
        # that stopped this worker's decoding for good, as a CI run once showed).
        finished = [r for r in stepped if r.done and self.requests.get(r.id) is r]
        for r in finished:
            del self.requests[r.id]
            self.source.forget(r.id)
        return finished
