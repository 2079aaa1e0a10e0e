"""A worker's side of moving trajectories: placing one (fresh, or departed and parked on
a source it claims from, pulling the KV where the two share a layout), departing one, the
source's side of a claim and its release, fencing by attempt, and delivering a finished
one. The rules are in `core.py`'s docstring.

A mixin of `WorkerCore` (`core.py`): the state it uses is declared below and owned there.
"""

from __future__ import annotations

import collections
import hashlib
import logging
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from cadence.worker.api import (
    ClaimRequest,
    Delivery,
    EvictResponse,
    Fence,
    KvOffer,
    MoveKind,
    PlaceRequest,
    PlaceResponse,
    ReleaseRequest,
    Source,
    Timings,
    TrajectoryState,
    Turn,
)
from cadence.worker.engine import Clock, Engine, EngineRequest, RoomError, pulled_tokens
from cadence.worker.held import Claim, Held, Identity, Refused, Release
from cadence.worker.outbox import Outbox

log = logging.getLogger("cadence.worker")


class HandOff:
    identity: Identity
    engine: Engine
    clock: Clock
    claim_from: Claim
    release_at: Release
    version: int | None
    draining: bool
    resident: dict[str, Held]
    parked: dict[str, Held]
    newest_attempt: dict[str, int]
    finished: collections.deque[TrajectoryState]
    unreleased: dict[str, tuple[Source, ReleaseRequest]]
    handed_off: dict[str, tuple[str, int]]
    counts: collections.Counter[str]
    outbox: Outbox | None
    eos_token_id: int | None
    wall: Callable[[], float]
    broken: str | None
    _advancing: int | None
    _placing: set[str]
    _stepped_at: float

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
