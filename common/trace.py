"""A run trace: what a run did, recorded so that the simulator can replay it.

The simulator's workload laws and step model are guesses until a run measures them. A
trace keeps, from one run, the three things those guesses stand for: each trajectory's
prompt, turns and tool latencies (the length and latency laws), each worker's decode
steps against its batch and context (the step model, per accelerator type), and what
the scheduler did (placements, moves, evictions, advances), so that a replay can be put
beside the run. `cadence run` writes one beside its results; the operator writes one
where the TrainingRun says; `cadence sim --trace` replays it (`sim/replay.py`).

The file is JSON Lines: a header first, then records of the kinds below in the order
they happened, and a summary last when the run ended. `format` names the version; a
reader refuses a version it does not know, and ignores nothing else: every line is
validated. The manual describes every field (docs/traces.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

FORMAT = "cadence.trace/1"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Header(_Record):
    """What ran: the simulator's scenario of the run's pool and knobs (as `cadence sim
    --scenario` reads it), the policy, the engine and its time compression."""

    kind: Literal["header"] = "header"
    format: str = FORMAT
    scenario: dict[str, Any]
    policy: str
    engine: str
    compression: float = Field(gt=0, le=1)
    started_at: float  # wall clock


class TurnSize(_Record):
    role: Literal["model", "environment"]
    tokens: int = Field(ge=0)
    version: int | None = None  # the version that generated a model turn
    seconds: float | None = Field(default=None, ge=0)  # an observation's wait


class Trajectory(_Record):
    """A delivered trajectory, by its sizes and times (`at`: seconds since the start
    when its record was read, shortly after it was delivered)."""

    kind: Literal["trajectory"] = "trajectory"
    at: float = Field(ge=0)
    id: str
    batch: int = Field(ge=0)
    group: int = Field(ge=0)
    worker: str
    prompt_tokens: int = Field(ge=0)
    turns: list[TurnSize]
    failed: bool = False
    latency_s: float | None = Field(default=None, ge=0)

    @property
    def response_tokens(self) -> int:
        return sum(t.tokens for t in self.turns if t.role == "model")

    @property
    def observation_tokens(self) -> list[int]:
        return [t.tokens for t in self.turns if t.role == "environment"]

    @property
    def tool_seconds(self) -> list[float]:
        return [t.seconds for t in self.turns if t.role == "environment" and t.seconds is not None]


class Steps(_Record):
    """One worker's decode steps between two observations: how many, how long they took
    in all, and the sequences and KV tokens they decoded over, summed over the steps.
    The means (`step_s`, `batch`, `context_tokens`) are one sample of its step time."""

    kind: Literal["steps"] = "steps"
    at: float = Field(ge=0)
    worker: str
    accelerator: str
    steps: int = Field(ge=1)
    seconds: float = Field(ge=0)
    sequences: int = Field(ge=0)
    context_tokens: int = Field(ge=0)

    @property
    def step_s(self) -> float:
        return self.seconds / self.steps

    @property
    def batch(self) -> float:
        return self.sequences / self.steps

    @property
    def mean_context(self) -> float:
        return self.context_tokens / self.steps


class Action(_Record):
    """An action the loop applied: `evict` (detail: the reason), `place` (detail:
    `fresh`, `resume` or `move`) or `advance` (detail: the version)."""

    kind: Literal["action"] = "action"
    at: float = Field(ge=0)
    action: Literal["evict", "place", "advance"]
    worker: str
    trajectory: str = ""
    detail: str = ""


class Update(_Record):
    """A policy version the trainer published, and how long its update took."""

    kind: Literal["update"] = "update"
    at: float = Field(ge=0)
    version: int = Field(ge=0)
    seconds: float = Field(ge=0)


class Summary(_Record):
    """The run's outcome, as `cadence run` reports it, and how long advances took."""

    kind: Literal["summary"] = "summary"
    wall_seconds: float = Field(ge=0)
    throughput_tok_s: float = Field(ge=0)
    latency_p95_s: float | None = None
    advance_seconds: float | None = None  # the mean time a worker took to advance


Record = Annotated[
    Header | Trajectory | Steps | Action | Update | Summary, Field(discriminator="kind")
]
_RECORD: TypeAdapter[Record] = TypeAdapter(Record)


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file and the line."""


class Trace(BaseModel):
    """A trace read whole."""

    model_config = ConfigDict(frozen=True)

    header: Header
    trajectories: list[Trajectory] = []
    steps: list[Steps] = []
    actions: list[Action] = []
    updates: list[Update] = []
    summary: Summary | None = None


def read(path: Path) -> Trace:
    """The trace at `path`, every line validated (errors: OSError, TraceError)."""
    with path.open(encoding="utf-8") as f:
        return parse(f, str(path))


def parse(lines: Iterable[str], name: str = "the trace") -> Trace:
    records = list(_records(lines, name))
    if not records or not isinstance(records[0], Header):
        raise TraceError(f"{name} does not start with a header line")
    header = records[0]
    if header.format != FORMAT:
        raise TraceError(f"{name} is in format {header.format!r}; this version reads {FORMAT}")
    by: dict[str, list[Any]] = {}
    for r in records[1:]:
        if isinstance(r, Header):
            raise TraceError(f"{name} has a second header")
        by.setdefault(r.kind, []).append(r)
    summaries = by.get("summary", [])
    return Trace(
        header=header,
        trajectories=by.get("trajectory", []),
        steps=by.get("steps", []),
        actions=by.get("action", []),
        updates=by.get("update", []),
        summary=summaries[-1] if summaries else None,
    )


def _records(lines: Iterable[str], name: str) -> Iterator[Record]:
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield _RECORD.validate_python(json.loads(line))
        except (json.JSONDecodeError, ValidationError) as e:
            reason = str(e).splitlines()[0] if isinstance(e, json.JSONDecodeError) else _first(e)
            raise TraceError(f"{name}, line {n}: {reason}") from None


def _first(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = err["loc"][1:] if len(err["loc"]) > 1 else err["loc"]  # past the record's kind
    where = ".".join(str(p) for p in loc)
    return f"{where}: {err['msg']}" if where else str(err["msg"])


class Writer:
    """Appends records to a trace file, one line each, flushed as written so that a
    run that dies leaves every record before its death."""

    def __init__(self, path: Path, header: Header) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[str] = path.open("w", encoding="utf-8")
        self.write(header)

    def write(self, *records: _Record) -> None:
        for r in records:
            self._file.write(r.model_dump_json(exclude_none=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
