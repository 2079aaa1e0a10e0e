"""The trainer's HTTP API, version 1: the bodies the service validates and the client
sends. Workers deliver finished samples here; the control loop reads the ledger's view,
admits groups and records where samples are; external trainers read batches."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cadence.worker.api import Attempt, Delivery, Version

SampleState = Literal["fresh", "placed", "parked", "environment", "delivered", "consumed"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FreshView(_Body):
    id: str
    group: int
    attempt: int


class InFlight(_Body):
    id: str
    group: int
    attempt: int
    state: SampleState
    worker: str | None
    version: int | None


class LedgerView(_Body):
    """GET /v1/ledger: what the control loop needs to rebuild its view.

    `GET /v1/ledger?since=<epoch>.<rev>` (the `epoch` and `rev` of an earlier answer)
    answers with `delta` true where it can: `fresh` and `in_flight` then hold only the
    samples that changed after `rev`, `ended` the ids of those that ended (delivered),
    and `prompts` the groups of the fresh ones. A reader applies it to the copy it kept
    (`operator/control/ledger_copy.py`). It answers whole (`delta` false) to a reader of
    another ledger (a new run's) or of a later `rev` than the ledger has.
    """

    version: int
    cursor: int  # groups admitted
    consumed: int  # batches trained
    total_groups: int
    group_size: int
    batch_groups: int
    admission_limit: int
    prompts: dict[int, list[int]]  # prompt token ids of every group with fresh samples
    fresh: list[FreshView]
    in_flight: list[InFlight]
    max_tokens: int
    temperature: float
    epoch: str = ""  # the ledger's identity
    rev: int = 0  # the latest change this answer includes
    delta: bool = False
    ended: list[str] = []

    @property
    def since(self) -> str:
        """What to send as `since` to read the changes after this answer."""
        return f"{self.epoch}.{self.rev}"


class EndedTurn(_Body):
    """One turn of an ended trajectory, by its size: tokens, the version that generated
    a model turn, and the seconds an environment took to answer an observation."""

    role: Literal["model", "environment"]
    tokens: int = Field(ge=0)
    version: int | None = None
    seconds: float | None = None


class Ended(_Body):
    """An accepted delivery, by its sizes and times (GET /v1/ended): what a run trace
    keeps of each trajectory. `seq` orders them as they arrived."""

    seq: int
    id: str
    batch: int
    group: int
    attempt: int
    worker: str
    prompt_tokens: int = Field(ge=0)
    turns: list[EndedTurn]
    failed: bool
    latency_s: float | None  # first decoding step to finish, summed over its workers
    finished_at: float  # wall clock


class EndedPage(_Body):
    """GET /v1/ended?after=<seq>: deliveries accepted after `seq`, oldest first, at most
    `limit`; `last` is the seq to ask after next."""

    items: list[Ended]
    last: int


class VersionInfo(_Body):
    version: int
    sha256: str
    weights_path: str  # relative to the trainer's URL


class AdmitRequest(_Body):
    groups: int = Field(ge=1, le=100_000)


class AdmitResponse(_Body):
    groups: list[int]


class RecordRequest(_Body):
    attempt: Attempt
    state: Literal["placed", "parked", "environment"]
    worker: str = Field(min_length=1, max_length=200)
    version: Version | None = None


class Record(RecordRequest):
    id: str = Field(min_length=1)


class RecordMany(_Body):
    """POST /v1/samples/record: where many samples are now, in one transaction."""

    records: list[Record] = Field(max_length=100_000)


class RequeueRequest(_Body):
    """POST /v1/samples/{id}/requeue. `fault` says whose the re-queue is: the sample's
    (its placement refused as invalid, its decode step failed, its delivery refused)
    counts toward the ledger's MAX_REQUEUES, after which it ends failed; a worker's
    (lost, killed, unreachable, full) does not: nothing is wrong with the sample."""

    fault: Literal["sample", "worker"] = "sample"


class RequeueResponse(_Body):
    attempt: int


class IngestResponse(_Body):
    result: Literal["accepted", "duplicate"]
    reward: float | None


class RunStats(_Body):
    version: int
    consumed: int
    iterations: int
    counts: dict[str, int]
    reward_by_version: dict[int, float]
    done: bool
    tokens_delivered: int = 0  # generated tokens of accepted deliveries
    latency_p50_s: float = 0.0  # first decoding step to finish, accepted deliveries
    latency_p95_s: float = 0.0
    arrivals: dict[str, int] = Field(default_factory=dict)  # deliveries by outcome
    accepted_twice: int = 0  # samples accepted more than once (a ledger bug if not 0)
    # Each published version's update: how long it took (the external trainer's: unknown).
    update_seconds: dict[int, float] = Field(default_factory=dict)


class RunSettings(_Body):
    """GET /v1/settings: what an external trainer must agree with (its group size, batch,
    staleness bound, sampling and token limits), as this run was started with."""

    task: str
    group_size: int
    batch_groups: int
    iterations: int
    eta: int
    max_tokens: int
    temperature: float


class SubmittedPrompt(_Body):
    """A prompt from an external trainer: token ids, or text the trainer tokenises."""

    prompt_token_ids: list[int] | None = Field(default=None, min_length=1)
    text: str | None = Field(default=None, min_length=1, max_length=100_000)
    answer: str = ""

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        if (self.prompt_token_ids is None) == (self.text is None):
            raise ValueError("give exactly one of 'prompt_token_ids' and 'text'")
        return self


class SubmitRequest(_Body):
    """POST /v1/prompts. With `first`, the prompts are the ones numbered `first` on in
    the run's order: a chunk sent again (a retry after a lost answer) queues nothing
    twice, and one that would leave a gap is refused (409)."""

    prompts: list[SubmittedPrompt] = Field(min_length=1, max_length=100_000)
    first: int | None = Field(default=None, ge=0, le=2**63 - 1)


class PromptQueue(_Body):
    """POST or GET /v1/prompts: prompts submitted so far, and how many of them the run
    has admitted (a submitter keeps the difference bounded)."""

    queued: int
    admitted: int


class BatchSample(_Body):
    id: str
    group: int
    version: int  # the policy version that generated it
    failed: bool
    delivery: Delivery  # prompt, turns with tokens and behaviour logprobs, timings


class Batch(_Body):
    """GET /v1/batches/{u}: batch u whole, in group order (so eta holds)."""

    batch: int
    samples: list[BatchSample]


class PublishRequest(_Body):
    """POST /v1/publish: an external trainer's update of batch `version - 1`."""

    version: int = Field(ge=1)
    weights_uri: str = Field(min_length=1)  # a path on the trainer's volume, or http(s)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


def sample_id(group: int, index: int) -> str:
    """Sample `index` of group `group`: the id every service names it by."""
    return f"g{group}-s{index}"


def sample_index(sid: str) -> int:
    """A sample's place in its group, from its id (`sample_id`'s inverse)."""
    return int(sid.rsplit("-s", 1)[1])
