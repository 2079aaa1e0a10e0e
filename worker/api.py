"""The worker's HTTP API, version 1: the pydantic models the service validates with and
the typed client sends, so both sides share one definition of every body.

The control plane carries ids and lengths only (docs/architecture.md, "Where token state
lives"):
an eviction answers with metadata, a placement of a departed trajectory names the worker
that holds it parked, and the destination pulls the token state from there itself. Every
placement carries an attempt number; a worker drops attempts older than the newest it has
seen for a trajectory, and a parked state is claimed under a lease ("Fencing").
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cadence.common.problem import Problem

API_VERSION = "v1"

TrajectoryId = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")]
WorkerId = Annotated[str, Field(min_length=1, max_length=200)]
# Token ids are checked against the model's vocabulary where the model is known (the
# worker's engine, the trainer); this bound only keeps them machine integers.
TokenIds = list[Annotated[int, Field(strict=True, ge=0, lt=2**31)]]
# Attempts and versions are stored as SQLite integers (64-bit signed) by the trainer.
# Strict: a JSON string or boolean is not a number. Bounded well inside SQLite's int64,
# so a re-queue's increment never overflows.
Attempt = Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)]
Version = Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)]
Seconds = Annotated[float, Field(allow_inf_nan=False)]
# vLLM raises a temperature below this to it ("may cause numerical errors nan or inf");
# a placement asking for less (but not 0, greedy) is refused instead of changed.
MIN_TEMPERATURE = 1e-2
Url = Annotated[str, Field(min_length=1, max_length=2048, pattern=r"^https?://[^\s/?#]+(/\S*)?$")]


def greedy_or_above_the_floor(t: float) -> float:
    """A temperature the workers take: 0, or at least vLLM's floor. The TrainingRun and
    the trainer's config check it too, so a run is refused where it is written rather
    than at every placement."""
    if 0.0 < t < MIN_TEMPERATURE:
        raise ValueError(f"must be 0 (greedy) or at least {MIN_TEMPERATURE}, vLLM's floor")
    return t


# Bounds no model or environment reaches; the worker bounds prompt + max_tokens by its
# own model's positions as well.
MAX_TOKENS = 2**20
MAX_TOOL_CALLS = 256


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sampling(_Body):
    """Sampling parameters for one trajectory; `seed` makes a sampled run repeatable.
    `ignore_eos` decodes to `max_tokens` whatever the model samples (vLLM's flag): a
    run whose workload draws each sample's length gives it as that sample's budget."""

    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    ignore_eos: bool = False

    _floor = field_validator("temperature")(greedy_or_above_the_floor)


class FreshStart(_Body):
    """A sample that has never decoded: its prompt and how to sample it."""

    prompt_token_ids: TokenIds = Field(min_length=1)
    sampling: Sampling = Sampling()
    max_tokens: int = Field(strict=True, ge=1, le=MAX_TOKENS)
    max_tool_calls: int = Field(default=0, strict=True, ge=0, le=MAX_TOOL_CALLS)


class Source(_Body):
    """Where a departed trajectory's state is parked: the worker to pull it from."""

    worker_id: WorkerId
    url: Url


# How a departed trajectory moves (the TrainingRun's `scheduler.migration`): auto pulls
# its KV blocks where the two workers' layouts match and re-prefills otherwise; kv is auto
# with the scheduler keeping moves within transfer groups; reprefill never pulls.
Migration = Literal["auto", "kv", "reprefill"]
MoveKind = Literal["kv", "reprefill"]


class PlaceRequest(_Body):
    """POST /v1/trajectories. Exactly one of `fresh` and `source`."""

    id: TrajectoryId
    attempt: Attempt
    version: Version
    fresh: FreshStart | None = None
    source: Source | None = None
    migration: Migration = "auto"

    @model_validator(mode="after")
    def _one_origin(self) -> Self:
        if (self.fresh is None) == (self.source is None):
            raise ValueError("give exactly one of 'fresh' (a new sample) and 'source'")
        return self


ResidentState = Literal["prefilling", "decoding", "preempted"]
ParkReason = Literal["evicted", "environment", "ready"]


class ResidentInfo(_Body):
    id: str
    attempt: int
    version: int
    context: int  # tokens of KV: prompt + generated + observations
    generated: int
    decoded_since_placement: int
    state: ResidentState


class ParkedInfo(_Body):
    """A departed trajectory whose token state this worker holds in host memory."""

    id: str
    attempt: int
    version: int
    context: int
    reason: ParkReason  # evicted; waiting for its environment; observation appended
    claimed_until: float | None = None  # a destination's lease, worker clock seconds


class StepCostInfo(_Body):
    """Seconds per decode step and per prefilled token, as the scheduler's `StepCost`."""

    weights_s: float = Field(ge=0, allow_inf_nan=False)
    kv_token_s: float = Field(ge=0, allow_inf_nan=False)
    seq_s: float = Field(ge=0, allow_inf_nan=False)
    overhead_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    prefill_token_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)


class Pace(_Body):
    """An emulated engine's pace: the modelled seconds of every step so far (compressed,
    as the host should have spent them) and the seconds the host ran past those steps'
    deadlines. Their ratio says how much slower than modelled the emulation runs."""

    modelled_s: float = Field(ge=0, allow_inf_nan=False)
    late_s: float = Field(ge=0, allow_inf_nan=False)


class DecodeSteps(_Body):
    """The engine's decode steps since it started, summed: how many, the seconds they
    took (wall time, each from the end of the step before), the sequences they decoded
    and the KV tokens they read. Between two readings the differences give the mean step
    time at the mean batch and context, the samples a trace fits the step model to.
    Steps that also prefilled are left out: a prefill is timed by its own model."""

    steps: int = Field(default=0, ge=0)
    seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    sequences: int = Field(default=0, ge=0)
    context_tokens: int = Field(default=0, ge=0)


class MoveCounts(_Body):
    """Moves into this worker since it started, by kind. `kv` counts placements that
    pulled the source's KV blocks, `kv_fallbacks` pulls that failed or timed out and
    re-prefilled instead (also counted in `reprefill`); tokens are the context moved
    (pulled) or recomputed (re-prefilled), bytes the KV pulled."""

    kv: int = 0
    reprefill: int = 0
    kv_fallbacks: int = 0
    kv_tokens: int = 0
    kv_bytes: int = 0
    reprefill_tokens: int = 0


class WorkerState(_Body):
    """GET /v1/state: everything the control loop reads from one worker.

    `max_seqs` is the engine's sequence limit and `step_cost` what a step and a prefill
    cost there, each None where the engine cannot say (vLLM on a CPU has no roofline).
    """

    worker_id: str
    accelerator: str
    affinity: int
    engine: Literal["vllm", "emulated"]
    version: int | None
    kv_capacity_tokens: int
    kv_used_tokens: int
    headroom_tokens: int
    residents: list[ResidentInfo]
    parked: list[ParkedInfo]
    draining: bool
    fell_behind: bool = False  # an emulated engine that could not keep its pace
    pace: Pace | None = None  # an emulated engine's; None on a real one
    decode_steps: DecodeSteps | None = None  # None: the engine cannot time its steps
    preemptions: int = 0  # residents the engine preempted for lack of KV (floor too low)
    delivering: list[str] = []  # finished, in the outbox, not yet taken by the trainer
    max_seqs: int | None = Field(default=None, ge=1)
    step_cost: StepCostInfo | None = None
    # Workers of one transfer group have the same KV layout (model, dtype, block size,
    # parallel layout, accelerator type) and can pull each other's KV; None: this one
    # cannot (an emulated engine, or vLLM started without KV transfer).
    transfer_group: str | None = None
    moves: MoveCounts = MoveCounts()
    # What a pull costs: the model's KV bytes per token, and the link's bytes per second
    # in this worker's time (an emulated one's modelled link; None where unknown).
    kv_bytes_per_token: int | None = Field(default=None, ge=1)
    kv_link_bytes_per_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # Why decoding has stalled (residents and no step within its bound); None: it steps.
    stalled: str | None = None


class PlaceResponse(_Body):
    """`moved` says how a departed trajectory came here from another worker (None for a
    fresh sample or a resume where it was parked), `move_reason` why it re-prefills.
    A pull that fails after this answer falls back to re-prefill, counted in the
    worker's `moves.kv_fallbacks`."""

    id: str
    attempt: int
    version: int
    context: int
    moved: MoveKind | None = None
    move_reason: str | None = None


class EvictResponse(_Body):
    """Metadata only: the tokens stay parked here until a destination claims them."""

    id: str
    attempt: int
    version: int
    context: int


class Turn(_Body):
    """One stretch of a trajectory: what the model generated, or an observation."""

    role: Literal["model", "environment"]
    token_ids: TokenIds
    # Per generated token, each <= 0 (a log probability); None for observations.
    logprobs: list[Annotated[float, Field(le=0.0, allow_inf_nan=False)]] | None = None
    version: Version | None = None  # the policy version that generated a model turn
    # How long the environment took to answer, for an observation (None: not timed).
    seconds: float | None = Field(default=None, ge=0, le=1e7, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_logprob_per_token(self) -> Self:
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"{len(self.logprobs)} logprobs for {len(self.token_ids)} tokens: one per token"
            )
        return self


class Timings(_Body):
    """Wall-clock seconds since the epoch (for display), and durations. A duration is
    summed over the workers that held the trajectory, each measuring its own share on
    its own monotonic clock: no clock of one host is compared with another's, and a
    wall clock that jumps changes no latency."""

    admitted_at: Seconds | None = None
    first_step_at: Seconds | None = None
    pending_s: Seconds = Field(default=0.0, ge=0)  # departed, waiting for a placement
    # Held by workers since its first step (resident, parked, with its environment): at
    # delivery, the trajectory's latency.
    elapsed_s: Seconds = Field(default=0.0, ge=0)


class KvOffer(_Body):
    """A source's KV blocks held for one pull: `tokens` of context are in them, `params`
    are vLLM's `kv_transfer_params` (the source engine's id, side channel, block ids),
    held for `lease_s` seconds from the claim's answer; after that they are freed and a
    pull could read blocks since reused, so a destination pulls well within it."""

    group: str = Field(max_length=200)
    tokens: int = Field(ge=0)
    lease_s: float = Field(gt=0, allow_inf_nan=False)
    params: dict[str, object]


class Fence(_Body):
    """One trajectory's current attempt, as the ledger has it: copies older are stale."""

    id: TrajectoryId
    attempt: Attempt


class FenceRequest(_Body):
    """POST /v1/fence: drop the copies held under attempts older than these."""

    items: list[Fence] = Field(max_length=4096)


class FenceResponse(_Body):
    dropped: list[str]


class ReleaseRequest(_Body):
    """POST /v1/parked/{id}/release: the destination has started it; the source frees it."""

    attempt: Attempt
    destination: WorkerId


class TrajectoryState(_Body):
    """A parked trajectory's whole token state, as a destination pulls it."""

    id: str
    attempt: int
    version: int
    prompt_token_ids: TokenIds
    turns: list[Turn]
    sampling: Sampling
    max_tokens: int
    tool_calls_left: int
    timings: Timings
    kv: KvOffer | None = None  # in a claim's answer, where the KV can be pulled

    @property
    def context(self) -> int:
        return len(self.prompt_token_ids) + sum(len(t.token_ids) for t in self.turns)

    @property
    def generated(self) -> int:
        return sum(len(t.token_ids) for t in self.turns if t.role == "model")


class ClaimRequest(_Body):
    """POST /v1/parked/{id}/claim: a destination takes the state under a lease.
    `transfer_group` is the destination's: where it is the source's too, the source
    offers the trajectory's KV blocks for a pull (`TrajectoryState.kv`)."""

    attempt: Attempt
    destination: WorkerId
    lease_s: float = Field(default=30.0, gt=0, le=600)
    transfer_group: str | None = Field(default=None, max_length=200)


class AdvanceRequest(_Body):
    """POST /v1/advance: switch to `version`, loading its weights from `weights_uri` (the
    trainer, a peer worker's /v1/weights/{version}, or a path) and checking `sha256`."""

    version: Version
    weights_uri: str = Field(min_length=1, max_length=2048)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Delivery(_Body):
    """A finished trajectory on its way to the trainer's ingest endpoint. The pair
    (id, attempt) is its idempotency key: the trainer accepts each once, and only the
    current attempt of each sample (docs/architecture.md, "Fencing")."""

    id: TrajectoryId
    attempt: Attempt
    version: Version
    worker_id: WorkerId
    prompt_token_ids: TokenIds
    turns: list[Turn]
    timings: Timings
    finished_at: Seconds  # wall clock, seconds since the epoch
    sampling: Sampling = Sampling()  # what the logprobs were computed under
    failed: bool = False  # ended without a valid completion (an environment gave up)

    @property
    def key(self) -> str:
        return f"{self.id}:{self.attempt}"


# --- a host of several workers (worker/host.py) -------------------------------------------


# Items one bulk call may carry; a client splits more into several calls.
BULK_ITEMS = 4096


class WorkerProgress(_Body):
    """A hosted worker's state as a change to the last whole state its host sent this
    reader (`GET /v1/states?since=`, `worker/state_progress.py`): every resident of that
    state, in its order, decoded `decoded[i]` more tokens (its context, generated and
    decoded-since-placement each grew by that much), the KV in use is now
    `kv_used_tokens`, the pace `pace` and the step totals `decode_steps`; nothing else
    changed."""

    kv_used_tokens: int
    decoded: list[Annotated[int, Field(ge=0)]]
    pace: Pace | None = None
    decode_steps: DecodeSteps | None = None


class HostStates(_Body):
    """GET /v1/states: every hosted worker's state, whole (`states`) or, with `since`
    (the `token` of this host's last answer), as `progress` where that is all that
    changed since the whole state last sent. An answer to an older or unknown `since`
    is whole. Each answer has a new token; the host keeps one, so a second reader costs
    the first one whole answers, never a wrong one."""

    states: dict[str, WorkerState]
    progress: dict[str, WorkerProgress] = {}
    token: str = ""


class HostPlace(_Body):
    worker: str
    request: PlaceRequest


class HostEvict(_Body):
    worker: str
    id: str


class HostPlaceMany(_Body):
    """Placements for several of a host's workers, made concurrently in one call."""

    items: list[HostPlace] = Field(max_length=BULK_ITEMS)


class HostEvictMany(_Body):
    items: list[HostEvict] = Field(max_length=BULK_ITEMS)


class Outcome(_Body):
    """One item of a bulk call: its answer, or the refusal the single call would give."""

    status: int = 200
    placed: PlaceResponse | None = None
    evicted: EvictResponse | None = None
    problem: Problem | None = None


class Outcomes(_Body):
    items: list[Outcome]
