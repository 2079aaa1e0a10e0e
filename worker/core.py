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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cadence.worker.api import (
    AdvanceRequest,
    EvictResponse,
    MoveCounts,
    ParkedInfo,
    ReleaseRequest,
    ResidentInfo,
    ResidentState,
    Source,
    TrajectoryState,
    Turn,
    WorkerState,
)
from cadence.worker.engine import Clock, Engine, EngineRequest
from cadence.worker.handoff import HandOff
from cadence.worker.held import Claim, FetchWeights, Held, Identity, Refused, Release
from cadence.worker.outbox import Outbox
from cadence.worker.tools import ToolUse

log = logging.getLogger("cadence.worker")


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


@dataclass
class WorkerCore(HandOff):
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
    # Each resident's last reported state and the fields it was built from (`state`).
    _reported: dict[str, tuple[tuple[object, ...], ResidentInfo]] = field(default_factory=dict)

    # --- observation -----------------------------------------------------------------

    def state(self) -> WorkerState:
        used = self.engine.used_tokens()
        capacity = self.engine.capacity_tokens
        residents = []
        reported = self._reported
        for h in self.resident.values():
            request = self.engine.requests.get(h.id)
            new = len(request.output.token_ids) if request else 0
            generated = h.generated + new
            context, state = len(h.context_ids) + new, _resident_state(request)
            fields = (h.attempt, h.version, context, generated, h.generated_at_placement, state)
            # A host states hundreds of workers a period, most residents unchanged since.
            info = reported.get(h.id)
            if info is None or info[0] != fields:
                resident = ResidentInfo(
                    id=h.id,
                    attempt=h.attempt,
                    version=h.version,
                    context=context,
                    generated=generated,
                    decoded_since_placement=generated - h.generated_at_placement,
                    state=state,
                )
                info = reported[h.id] = (fields, resident)
            residents.append(info[1])
        if len(reported) > len(residents):
            for rid in reported.keys() - self.resident.keys():
                del reported[rid]
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
            decode_steps=self.engine.decode_steps,
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
        asked = self.clock.now()
        observation = await self.tools.observe(held.id, index, text, held.attempt)
        if observation is None:
            del self.parked[held.id]
            self._deliver(held, failed=True)
            if self.outbox is not None:
                await self.outbox.flush()
            return
        seconds = max(0.0, self.clock.now() - asked)
        held.turns.append(Turn(role="environment", token_ids=observation, seconds=seconds))
        held.tool_calls_left -= 1
        held.reason, held.parked_since = "ready", self.clock.now()
