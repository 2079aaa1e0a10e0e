"""One worker's trajectories: what is resident, what is parked, and the rules between.

This is the worker without HTTP: the service (`app.py`) maps each endpoint onto one
method here, and tests drive it directly with a fake clock and an emulated engine.

Rules kept here (docs/architecture.md, "Where token state lives" and
"Fencing"):
- a trajectory is resident on at most one worker: a destination pulls a departed
  trajectory's state from the worker it is parked on under a lease, starts it, then
  acknowledges, and only then does the source release it; a destination that dies before
  acknowledging leaves the state parked for another placement;
- attempts fence: every placement carries an attempt number, a worker refuses an attempt
  older than the newest it has seen for that trajectory, and a claim by a newer attempt
  supersedes an older claim's lease;
- the worker serves one policy version and advances only when nothing is resident;
- a trajectory that writes a tool call departs and waits, parked, for its environment
  (`tools.py`); only once the observation is appended can it be placed again;
- a move carries the token state in the claim either way; between two workers of one
  transfer group (the same KV layout) the source also offers its KV blocks, which the
  destination pulls instead of re-prefilling the context. A pull that fails falls back
  to a re-prefill of the state it already holds, so the hand-off's guarantees (resident
  on one worker, ended exactly once) never depend on the pull.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from cadence.worker.api import (
    AdvanceRequest,
    ClaimRequest,
    Delivery,
    EvictResponse,
    Fence,
    KvOffer,
    MoveCounts,
    MoveKind,
    ParkedInfo,
    ParkReason,
    PlaceRequest,
    PlaceResponse,
    ReleaseRequest,
    ResidentInfo,
    ResidentState,
    Sampling,
    Source,
    Timings,
    TrajectoryState,
    Turn,
    WorkerState,
)
from cadence.worker.engine import Clock, Engine, EngineRequest, RoomError, pulled_tokens
from cadence.worker.outbox import Outbox
from cadence.worker.tools import ToolUse

log = logging.getLogger("cadence.worker")


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


def _resident_state(request: EngineRequest | None) -> ResidentState:
    if request is not None and request.preempted:
        return "preempted"
    return "decoding" if request is not None and request.prefilled else "prefilling"


THROUGHPUT_WINDOW_S = 10.0
MAX_STEP_FAILURES = 3  # failed engine steps in a row before the worker is broken
# A worker with residents and no step for this long has stalled: the larger of a floor
# (a loaded machine's slow steps are not stalls) and STALL_STEPS of its predicted step.
STALL_MIN_S = 60.0
STALL_STEPS = 100

# Where a version's weights come from: the trainer, a peer, or a path.
FetchWeights = Callable[[str], Awaitable[bytes]]

# How a destination reaches the worker a trajectory is parked on (HTTP in the service,
# a direct call in tests).
Claim = Callable[[Source, str, ClaimRequest], Awaitable[TrajectoryState]]
Release = Callable[[Source, str, ReleaseRequest], Awaitable[None]]


@dataclass
class WorkerCore:
    identity: Identity
    engine: Engine
    clock: Clock
    claim_from: Claim
    release_at: Release
    version: int | None = None
    fetch_weights: FetchWeights | None = None
    weights_dir: Path | None = None
    weights: tuple[int, Path, str] | None = None  # (version, file, sha256) held here
    draining: bool = False
    resident: dict[str, Held] = field(default_factory=dict)
    parked: dict[str, Held] = field(default_factory=dict)
    newest_attempt: dict[str, int] = field(default_factory=dict)
    finished: collections.deque[TrajectoryState] = field(default_factory=collections.deque)
    unreleased: dict[str, tuple[Source, ReleaseRequest]] = field(default_factory=dict)
    # Who took each trajectory released from here, so a repeated acknowledgement is
    # answered and a superseded one refused.
    handed_off: dict[str, tuple[str, int]] = field(default_factory=dict)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    outbox: Outbox | None = None  # finished trajectories go here; kept in `finished` if None
    tools: ToolUse | None = None  # multi-turn; without it a tool call is just text
    eos_token_id: int | None = None
    # Timestamps a sample carries between workers and to the trainer are wall-clock
    # (comparable across hosts); `clock` paces and measures durations on this one.
    wall: Callable[[], float] = time.time
    # Why this worker cannot decode (its decode loop died, or its engine failed
    # MAX_STEP_FAILURES steps in a row); its health probe fails so the pod is restarted.
    broken: str | None = None
    _failed_steps: int = 0  # in a row
    # One advance at a time, and no placement while it runs; one placement per trajectory.
    _advancing: int | None = None  # the version being fetched and loaded
    _placing: set[str] = field(default_factory=set)
    # How long a step may take before the worker counts as stalled; None: derived.
    stall_after_s: float | None = None
    _stepped_at: float = 0.0  # the last step that decoded, or when work reached an idle engine
    _decoded_at_step: int = 0
    hold_decoding: bool = False  # a fault injected on purpose (SIGUSR1): nothing steps
    _waiting: set[asyncio.Task[None]] = field(default_factory=set)  # environment calls
    # (time, tokens decoded so far) after each step, over the last THROUGHPUT_WINDOW_S.
    _progress: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)

    # --- observation -----------------------------------------------------------------

    def state(self) -> WorkerState:
        used = self.engine.used_tokens()
        capacity = self.engine.capacity_tokens
        residents = []
        for h in self.resident.values():
            request = self.engine.requests.get(h.id)
            new = len(request.output.token_ids) if request else 0
            generated = h.generated + new
            residents.append(
                ResidentInfo(
                    id=h.id,
                    attempt=h.attempt,
                    version=h.version,
                    context=len(h.context_ids) + new,
                    generated=generated,
                    decoded_since_placement=generated - h.generated_at_placement,
                    state=_resident_state(request),
                )
            )
        now = self.clock.now()
        # A lease is reported only while it runs: the loop plans nothing for a claimed
        # trajectory, and a destination that gave up its claim never releases it.
        parked = [
            ParkedInfo(
                id=h.id,
                attempt=h.attempt,
                version=h.version,
                context=len(h.context_ids),
                reason=h.reason,
                claimed_until=h.lease[2] if h.lease and h.lease[2] > now else None,
            )
            for h in self.parked.values()
        ]
        return WorkerState(
            worker_id=self.identity.worker_id,
            accelerator=self.identity.accelerator,
            affinity=self.identity.affinity,
            engine=self.engine.kind,
            version=self.version,
            kv_capacity_tokens=capacity,
            kv_used_tokens=used,
            headroom_tokens=capacity - used,
            residents=residents,
            parked=parked,
            draining=self.draining,
            fell_behind=self.engine.fell_behind,
            pace=self.engine.pace,
            preemptions=self.engine.preemptions,
            delivering=[d.id for d in self.outbox.queue] if self.outbox is not None else [],
            max_seqs=self.engine.max_seqs,
            step_cost=self.engine.step_cost,
            transfer_group=self.transfer_group,
            kv_bytes_per_token=self.engine.kv_bytes_per_token or None,
            kv_link_bytes_per_s=self.engine.kv_link_bytes_per_s,
            moves=MoveCounts(**{k: self.counts[f"moves_{k}"] for k in MoveCounts.model_fields}),
            stalled=self.stalled(),
        )

    @property
    def transfer_group(self) -> str | None:
        """Workers that can pull each other's KV: the same engine layout (model, dtype,
        block size, parallel layout) on the same accelerator type."""
        layout = self.engine.transfer_layout
        if layout is None:
            return None
        key = f"{self.identity.accelerator}|{layout}"
        return f"{self.identity.accelerator}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    # --- placement ---------------------------------------------------------------------

    def _check_fence(self, rid: str, attempt: int) -> None:
        seen = self.newest_attempt.get(rid, -1)
        if attempt < seen:
            raise Refused(409, "stale_attempt", f"attempt {attempt} of {rid} is older than {seen}")

    def _fence(self, rid: str, attempt: int) -> None:
        self._check_fence(rid, attempt)
        self.newest_attempt[rid] = attempt

    def _check_tokens(self, rid: str, ids: list[int]) -> None:
        """Refuse token ids the model has no embedding for, as vLLM refuses a prompt:
        decoding them would fail inside the engine's step, for every resident."""
        vocab = self.engine.vocab_size
        if vocab is None or not ids:
            return
        worst = max(ids)
        if worst >= vocab:
            raise Refused(
                422,
                "invalid",
                f"{rid}: token id {worst} is outside the model's vocabulary ({vocab})",
            )

    def _check_length(self, rid: str, prompt: int, max_tokens: int) -> None:
        """Refuse a sample the model cannot hold, as vLLM refuses a request longer than
        its positions: accepted, its prefill would occupy the engine and still fail."""
        positions = self.engine.max_model_len
        if positions is not None and prompt + max_tokens > positions:
            raise Refused(
                422,
                "too_long",
                f"{rid}: a {prompt}-token prompt and {max_tokens} tokens to generate exceed "
                f"the model's {positions} positions",
            )

    async def place(self, req: PlaceRequest) -> PlaceResponse:
        """Start a trajectory here: a fresh sample, or a departed one pulled from its source."""
        held = self.resident.get(req.id)
        if held is not None and held.attempt == req.attempt:  # a retried request
            return self._placed(held)
        if self.draining:
            raise Refused(409, "draining", f"worker {self.identity.worker_id} is draining")
        if self.broken is not None:
            raise Refused(503, "broken", self.broken)
        if self.outbox is not None and self.outbox.full:
            raise Refused(503, "outbox_full", "the trainer is not taking deliveries; retry later")
        if self.version != req.version:
            raise Refused(
                409,
                "version",
                f"{req.id} is for version {req.version}; this worker serves {self.version}",
            )
        if self._advancing is not None:
            raise Refused(409, "advancing", f"this worker is advancing to {self._advancing}")
        if req.id in self._placing:
            raise Refused(409, "placing", f"{req.id} is being placed here already")
        # Every placement comes under a new attempt: one this worker has seen already is a
        # replay (a retried call whose first landed, a stale copy of the plan).
        seen = self.newest_attempt.get(req.id, -1)
        if req.attempt <= seen:
            raise Refused(
                409, "stale_attempt", f"attempt {req.attempt} of {req.id} is not newer than {seen}"
            )
        if held is not None:
            raise Refused(409, "resident", f"{req.id} is resident here under another attempt")
        self._placing.add(req.id)
        try:
            placed = await self._place(req)
        finally:
            self._placing.discard(req.id)
        self.newest_attempt[req.id] = max(req.attempt, self.newest_attempt.get(req.id, -1))
        return placed

    async def _place(self, req: PlaceRequest) -> PlaceResponse:
        if req.fresh is not None:
            f = req.fresh
            self._check_tokens(req.id, f.prompt_token_ids)
            self._check_length(req.id, len(f.prompt_token_ids), f.max_tokens)
            held = Held(
                req.id,
                req.attempt,
                req.version,
                list(f.prompt_token_ids),
                [],
                f.sampling,
                f.max_tokens,
                f.max_tool_calls,
                Timings(first_step_at=self.wall()),
                arrived_at=self.clock.now(),
            )
            self._start(held)
            return self._placed(held)
        assert req.source is not None
        if req.source.worker_id == self.identity.worker_id:
            parked = self.parked.get(req.id)
            if parked is None:
                raise Refused(404, "not_parked", f"{req.id} is not parked here")
            if parked.reason == "environment":
                raise Refused(409, "environment", f"{req.id} is waiting for its environment")
            parked.attempt = req.attempt
            self._start(parked)
            del self.parked[req.id]
            return self._placed(parked)
        group = self.transfer_group if req.migration != "reprefill" else None
        claim = ClaimRequest(
            attempt=req.attempt, destination=self.identity.worker_id, transfer_group=group
        )
        asked = self.clock.now()
        state = await self.claim_from(req.source, req.id, claim)
        if state.version != req.version:
            raise Refused(409, "version", f"{req.id} was generated under version {state.version}")
        held = Held.of(state, req.attempt)
        held.arrived_at = self.clock.now()  # the source counted its share to the claim
        self._check_tokens(req.id, held.context_ids)
        reason = self._no_pull(req, state.kv, self.clock.now() - asked)
        pull = None if reason is not None or state.kv is None else (state.kv, req.source.url)
        self._start(held, pull=pull)  # on failure nothing is released: it stays parked there
        moved: MoveKind = "kv" if pull is not None else "reprefill"
        if pull is None:
            self.counts["moves_reprefill"] += 1
            self.counts["moves_reprefill_tokens"] += len(held.context_ids)
        release = ReleaseRequest(attempt=req.attempt, destination=self.identity.worker_id)
        self.unreleased[req.id] = (req.source, release)
        await self._release(req.id)
        return self._placed(held, moved, reason)

    def _no_pull(self, req: PlaceRequest, kv: KvOffer | None, waited: float) -> str | None:
        """Why a move re-prefills instead of pulling the KV; None: it pulls."""
        if req.migration == "reprefill":
            return "the run's migration is reprefill"
        if self.transfer_group is None:
            return f"{self.identity.worker_id} cannot pull KV (no KV transfer)"
        if kv is None:
            return "the source offered no KV (another KV layout, or no KV transfer there)"
        if kv.group != self.transfer_group:
            return f"KV layouts differ ({kv.group} here {self.transfer_group})"
        if waited > kv.lease_s / 2:
            return f"the claim took {waited:.1f} s of the source's {kv.lease_s:g} s KV lease"
        return None

    async def retry_releases(self) -> None:
        """Acknowledge hand-offs to their sources. A failed acknowledgement is kept and
        retried (each placement retries its own; the decode loop retries the rest): the
        trajectory runs here meanwhile, and its source keeps the state parked under this
        worker's claim, so nobody else can start it."""
        for rid in list(self.unreleased):
            await self._release(rid)

    async def _release(self, rid: str) -> None:
        entry = self.unreleased.get(rid)
        if entry is None:
            return
        source, release = entry
        try:
            await self.release_at(source, rid, release)
        except Refused as e:
            if e.reason != "not_claimed":
                return
            # A newer attempt claimed it meanwhile: this copy is stale, stop it.
            held = self.resident.get(rid)
            if held is not None and held.attempt == release.attempt:
                del self.resident[rid]
                self.engine.abort(rid)
        except Exception:  # the source is unreachable for now
            return
        if self.unreleased.get(rid) == entry:
            del self.unreleased[rid]

    def _start(self, held: Held, pull: tuple[KvOffer, str] | None = None) -> None:
        """Put `held` on the engine; with `pull` (the source's offer and URL), pulling its
        KV from the source."""
        budget = held.max_tokens - held.generated
        if budget < 1:
            raise Refused(409, "finished", f"{held.id} has no tokens left to generate")
        eos = None if held.sampling.ignore_eos else self.eos_token_id
        request = EngineRequest(held.id, held.context_ids, budget, held.sampling, eos_token_id=eos)
        if pull is not None:
            offer, url = pull
            params = dict(offer.params)
            if "remote_host" in params:
                # The source's side channel listens on its pod's address (it may bind
                # 0.0.0.0): reach it where its API was reached.
                params["remote_host"] = urlsplit(url).hostname
            request.kv_params = params
            block = getattr(self.engine, "block_size", 1)
            request.kv_expected = pulled_tokens(offer.tokens, request.context, block)
        try:
            self.engine.add(request)
        except RoomError as e:
            raise Refused(409, "no_room", str(e)) from None
        held.generated_at_placement = held.generated
        held.scanned = 0
        held.lease = None
        if held.parked_since is not None:
            held.timings = held.timings_at(self.clock.now())
            held.parked_since = None
        if not self.resident:
            self._stepped_at = self.clock.now()
        self.resident[held.id] = held
        self.counts["placements"] += 1

    def _placed(
        self, held: Held, moved: MoveKind | None = None, reason: str | None = None
    ) -> PlaceResponse:
        return PlaceResponse(
            id=held.id,
            attempt=held.attempt,
            version=held.version,
            context=len(held.context_ids),
            moved=moved,
            move_reason=reason,
        )

    # --- departure ---------------------------------------------------------------------

    def evict(self, rid: str) -> EvictResponse:
        """Stop decoding `rid`, free its KV, keep its tokens parked here."""
        held = self.resident.get(rid)
        if held is None:
            raise Refused(404, "not_resident", f"{rid} is not resident here")
        if rid not in self.engine.requests:
            # The engine ended it since the last step (vLLM finishes requests as they
            # stream, between steps): the next step delivers it.
            raise Refused(409, "finished", f"{rid} finished before it could be evicted")
        del self.resident[rid]
        self._absorb(held, self.engine.abort(rid))
        if held.generated >= held.max_tokens:
            # It decoded its last token between the observation and this call: nothing is
            # left to resume anywhere, so it ends here instead of parking for ever.
            self._deliver(held)
            raise Refused(409, "finished", f"{rid} finished before it could be evicted")
        held.reason, held.parked_since = "evicted", self.clock.now()
        self.parked[rid] = held
        self.counts["departures"] += 1
        return EvictResponse(
            id=rid, attempt=held.attempt, version=held.version, context=len(held.context_ids)
        )

    def fence(self, items: Sequence[Fence]) -> list[str]:
        """The ledger moved these trajectories on to a newer attempt (this worker was
        taken for lost, or a placement here timed out and was re-queued): drop the copies
        held here under older attempts, so they neither decode for nothing nor hold KV.
        A parked copy that a newer attempt has claimed stays until it is released.
        Returns the ids dropped."""
        dropped = []
        for f in items:
            self.newest_attempt[f.id] = max(f.attempt, self.newest_attempt.get(f.id, -1))
            held = self.resident.get(f.id)
            if held is not None and held.attempt < f.attempt:
                del self.resident[f.id]
                self.engine.abort(f.id)
                dropped.append(f.id)
                continue
            held = self.parked.get(f.id)
            if held is None or held.attempt >= f.attempt or held.reason == "environment":
                continue
            if held.lease is not None and held.lease[1] >= f.attempt:
                continue
            del self.parked[f.id]
            dropped.append(f.id)
        if dropped:
            self.counts["fenced"] += len(dropped)
            log.warning(
                "worker %s: dropped %s, superseded by newer attempts",
                self.identity.worker_id,
                ", ".join(dropped),
            )
        return dropped

    def _absorb(self, held: Held, request: EngineRequest) -> None:
        out = request.output
        if out.token_ids:
            held.turns.append(
                Turn(
                    role="model",
                    token_ids=list(out.token_ids),
                    logprobs=list(out.logprobs),
                    version=held.version,
                )
            )

    async def claim(self, rid: str, req: ClaimRequest) -> TrajectoryState:
        """A destination takes a parked state under a lease (it is not released yet); one
        of this worker's transfer group gets the trajectory's KV blocks offered too."""
        held = self.parked.get(rid)
        if held is None:
            raise Refused(404, "not_parked", f"{rid} is not parked here")
        if held.reason == "environment":
            raise Refused(409, "environment", f"{rid} is waiting for its environment")
        if held.lease is not None:
            destination, attempt, _ = held.lease
            if req.attempt == attempt and req.destination != destination:
                raise Refused(409, "claimed", f"attempt {attempt} of {rid} is {destination}'s")
        # A newer attempt supersedes an older claim (its destination is presumed lost); an
        # older one is refused here. The lease's end tells the control loop how long an
        # unacknowledged hand-off may stay in flight.
        self._fence(rid, req.attempt)
        held.lease = (req.destination, req.attempt, self.clock.now() + req.lease_s)
        state = held.to_state(self.clock.now())
        group = self.transfer_group
        if group is None or req.transfer_group != group:
            return state
        if held.version != self.version:
            # Advanced since it departed: the blocks an export computed now would be the
            # new policy's, not those of the version the trajectory runs under.
            self.counts["exports_stale"] += 1
            return state
        try:
            tokens, params = await self.engine.export(rid, held.context_ids)
        except Exception as e:  # the destination re-prefills; the hand-off goes on
            log.warning("worker %s: no KV export for %s: %r", self.identity.worker_id, rid, e)
            self.counts["exports_failed"] += 1
            return state
        self.counts["exports"] += 1
        offer = KvOffer(group=group, tokens=tokens, lease_s=self.engine.kv_lease_s, params=params)
        return state.model_copy(update={"kv": offer})

    def release(self, rid: str, req: ReleaseRequest) -> None:
        """The destination acknowledged: forget the parked state it claimed."""
        held = self.parked.get(rid)
        claimant = (req.destination, req.attempt)
        if held is None and self.handed_off.get(rid) == claimant:
            return  # a repeated acknowledgement
        if held is None or held.lease is None or held.lease[:2] != claimant:
            raise Refused(409, "not_claimed", f"{rid} is not claimed by {req.destination}")
        del self.parked[rid]
        self.handed_off[rid] = claimant

    async def advance(self, req: AdvanceRequest) -> WorkerState:
        """Switch to `req.version`: only when nothing is resident, never backwards; the
        weights must match their sha256. Idempotent for the version already served."""
        if self.weights is not None and self.weights[0] == req.version:
            if self.weights[2] != req.sha256:
                raise Refused(409, "checksum", f"version {req.version} is held with another sha256")
            return self.state()
        if self._advancing is not None:
            raise Refused(409, "advancing", f"this worker is advancing to {self._advancing}")
        if self.resident or self._placing:
            busy = len(self.resident) + len(self._placing)
            raise Refused(409, "residents", f"{busy} trajectories are resident or being placed")
        if self.version is not None and req.version < self.version:
            raise Refused(409, "backwards", f"this worker serves {self.version} already")
        self._advancing = req.version
        try:
            return await self._advance(req)
        finally:
            self._advancing = None

    async def _advance(self, req: AdvanceRequest) -> WorkerState:
        if self.fetch_weights is None or self.weights_dir is None:
            raise Refused(409, "no_weights", "this worker was started without a weights store")
        try:
            data = await self.fetch_weights(req.weights_uri)
        except Refused:
            raise
        except Exception as e:
            raise Refused(502, "fetch", f"cannot fetch {req.weights_uri}: {e}") from None
        digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
        if digest != req.sha256:
            raise Refused(409, "checksum", f"the weights at {req.weights_uri} are not {req.sha256}")
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        path = self.weights_dir / f"v{req.version}.safetensors"
        partial = path.with_suffix(".partial")
        await asyncio.to_thread(partial.write_bytes, data)
        partial.replace(path)
        try:
            await self.engine.load_weights(path)
        except Exception as e:
            path.unlink(missing_ok=True)
            raise Refused(
                422, "weights", f"version {req.version}'s weights do not load: {e}"
            ) from None
        if self.weights is not None:
            self.weights[1].unlink(missing_ok=True)
        self.weights = (req.version, path, digest)
        self.version = req.version
        return self.state()

    def weights_file(self, version: int) -> Path:
        if self.weights is None or self.weights[0] != version:
            raise Refused(404, "no_weights", f"this worker does not hold version {version}")
        return self.weights[1]

    def drain(self) -> list[EvictResponse]:
        """Accept nothing more and depart every resident."""
        self.draining = True
        return [self.evict(rid) for rid in list(self.resident)]

    # --- decoding ------------------------------------------------------------------------

    async def step(self) -> list[TrajectoryState]:
        """One engine step; trajectories that wrote a tool call leave for their
        environment, finished ones for the outbox."""
        finished = await self.engine.step()
        self._failed_steps = 0
        self._count_pulls()
        now = self.clock.now()
        # Progress is tokens, not calls: vLLM's step returns after a short wait whether
        # or not its engine produced anything.
        if finished or self.engine.decoded_tokens != self._decoded_at_step:
            self._stepped_at = now
            self._decoded_at_step = self.engine.decoded_tokens
        self._progress.append((now, self.engine.decoded_tokens))
        while self._progress and self._progress[0][0] < now - THROUGHPUT_WINDOW_S:
            self._progress.popleft()
        if self.tools is not None:
            finished = [r for r in finished if not self._scan(r, in_engine=False)]
            for request in list(self.engine.requests.values()):
                self._scan(request, in_engine=True)
        done = []
        for request in finished:
            held = self.resident.pop(request.id)
            self._absorb(held, request)
            done.append(self._deliver(held, failed=request.error is not None))
        if self.outbox is not None:
            await self.outbox.flush()
        return done

    def _count_pulls(self) -> None:
        pulls, self.engine.pulls[:] = list(self.engine.pulls), []
        for p in pulls:
            if p.failure is None:
                self.counts["moves_kv"] += 1
                self.counts["moves_kv_tokens"] += p.cached
                self.counts["moves_kv_bytes"] += p.cached * self.engine.kv_bytes_per_token
                continue
            self.counts["moves_kv_fallbacks"] += 1
            self.counts["moves_reprefill"] += 1
            self.counts["moves_reprefill_tokens"] += p.context - p.cached
            log.warning(
                "worker %s: the KV pull of %s fell back to re-prefill: %s",
                self.identity.worker_id,
                p.rid,
                p.failure,
            )

    def fail_step(self, error: BaseException) -> list[str]:
        """The engine's step raised: its residents' state there is unknown, so each is
        dropped (aborted, forgotten); the control loop finds them on no worker and
        re-queues them from their prompts. After MAX_STEP_FAILURES failed steps in a
        row the engine is taken for broken. Returns the dropped ids."""
        dropped = list(self.resident)
        for rid in dropped:
            del self.resident[rid]
            with contextlib.suppress(Exception):
                self.engine.abort(rid)
        self.counts["step_failures"] += 1
        self._failed_steps += 1
        self._stepped_at = self.clock.now()
        log.error(
            "worker %s: a decode step failed (%r); dropped %s for re-queueing",
            self.identity.worker_id,
            error,
            ", ".join(dropped) or "nothing",
        )
        if self._failed_steps >= MAX_STEP_FAILURES:
            self.broken = f"the engine failed {self._failed_steps} steps in a row: {error!r}"
        return dropped

    def stall_bound_s(self) -> float:
        """How long the current residents' next step may take before it is a stall."""
        if self.stall_after_s is not None:
            return self.stall_after_s
        cost = self.engine.step_cost
        if cost is None:
            return STALL_MIN_S
        waiting = sum(r.context for r in self.engine.requests.values() if not r.prefilled)
        predicted = (
            cost.weights_s
            + cost.overhead_s
            + cost.seq_s * len(self.resident)
            + cost.kv_token_s * self.engine.used_tokens()
            + cost.prefill_token_s * waiting
        )
        return max(STALL_MIN_S, STALL_STEPS * predicted)

    def stalled(self) -> str | None:
        """Why decoding is stalled (residents, and no step within the bound), or None."""
        if not self.resident:
            return None
        quiet = self.clock.now() - self._stepped_at
        bound = self.stall_bound_s()
        if quiet <= bound:
            return None
        return (
            f"{len(self.resident)} trajectories resident and no decode step for "
            f"{quiet:.0f} s (the bound is {bound:.0f} s)"
        )

    def throughput(self) -> float:
        """Tokens decoded per second over the last THROUGHPUT_WINDOW_S of steps."""
        if len(self._progress) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._progress[0], self._progress[-1]
        if t1 - t0 <= 0 or self.clock.now() - t1 > THROUGHPUT_WINDOW_S:
            return 0.0
        return (n1 - n0) / (t1 - t0)

    def _deliver(self, held: Held, *, failed: bool = False) -> TrajectoryState:
        state = held.to_state(self.clock.now())
        self.counts["failed" if failed else "finished"] += 1
        if self.outbox is None:
            self.finished.append(state)
            return state
        self.outbox.put(
            Delivery(
                id=held.id,
                attempt=held.attempt,
                version=held.version,
                worker_id=self.identity.worker_id,
                prompt_token_ids=held.prompt_token_ids,
                turns=held.turns,
                timings=state.timings,
                finished_at=self.wall(),
                sampling=held.sampling,
                failed=failed,
            )
        )
        return state

    # --- multi-turn ----------------------------------------------------------------------

    def _scan(self, request: EngineRequest, *, in_engine: bool) -> bool:
        """Depart `request`'s trajectory for its environment if it just completed a tool
        call; True if it did (or ended because its budget ran out with the call)."""
        assert self.tools is not None
        held = self.resident.get(request.id)
        out = request.output
        if held is None or held.tool_calls_left < 1 or len(out.token_ids) <= held.scanned:
            return False
        seen = held.since_observation(self.tools.window) + out.token_ids[: held.scanned]
        k = self.tools.end_of_call(seen, out.token_ids[held.scanned :])
        cut = held.scanned + (k or 0)
        held.scanned = len(out.token_ids)
        if k is None:
            return False
        if in_engine:
            self.engine.abort(held.id)
        del out.token_ids[cut:], out.logprobs[cut:]
        del self.resident[held.id]
        self._absorb(held, request)
        if held.generated >= held.max_tokens:  # no budget left to answer with
            self._deliver(held)
            return True
        held.reason, held.parked_since = "environment", None
        self.parked[held.id] = held
        self.counts["tool_calls"] += 1
        task = asyncio.get_running_loop().create_task(self._answer(held))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)
        return True

    async def _answer(self, held: Held) -> None:
        """Ask the environment; append its observation, or end the sample failed."""
        assert self.tools is not None
        index = sum(1 for t in held.turns if t.role == "environment")
        text = self.tools.decode(held.since_observation())
        observation = await self.tools.observe(held.id, index, text, held.attempt)
        if observation is None:
            del self.parked[held.id]
            self._deliver(held, failed=True)
            if self.outbox is not None:
                await self.outbox.flush()
            return
        held.turns.append(Turn(role="environment", token_ids=observation))
        held.tool_calls_left -= 1
        held.reason, held.parked_since = "ready", self.clock.now()
