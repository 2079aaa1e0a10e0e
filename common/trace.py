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

import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

FORMAT = "cadence.trace/1"

# What a reader takes. A record's numbers are finite and below these: a count or a token
# figure past 2**53 is not exact as a float, and a second count past a century of
# seconds is no run's; anything larger is refused, naming its line, not carried into a
# fit as inf or nan. A line longer than MAX_LINE (no record is near it) or a file past
# MAX_BYTES is refused before it is read whole (`/dev/zero` has no line end).
MAX_COUNT = 2**53
MAX_AT_S = 100 * 365 * 86_400.0
MAX_LINE = 1 << 24
MAX_BYTES = 1 << 32

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Seconds = Annotated[float, Field(ge=0, le=MAX_AT_S)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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
    tokens: Count
    version: Count | None = None  # the version that generated a model turn
    seconds: Seconds | None = None  # an observation's wait


class Trajectory(_Record):
    """A delivered trajectory, by its sizes and times (`at`: seconds since the start
    when its record was read, shortly after it was delivered)."""

    kind: Literal["trajectory"] = "trajectory"
    at: Seconds
    id: str
    batch: Count
    group: Count
    worker: str
    prompt_tokens: Count
    turns: list[TurnSize]
    failed: bool = False
    latency_s: Seconds | None = None

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
    at: Seconds
    worker: str
    accelerator: str
    steps: int = Field(ge=1, le=MAX_COUNT)
    seconds: Seconds
    sequences: Count
    context_tokens: Count

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
    at: Seconds
    action: Literal["evict", "place", "advance"]
    worker: str
    trajectory: str = ""
    detail: str = ""


class Update(_Record):
    """A policy version the trainer published, and how long its update took."""

    kind: Literal["update"] = "update"
    at: Seconds
    version: Count
    seconds: Seconds


class Summary(_Record):
    """The run's outcome, as `cadence run` reports it, and how long advances took."""

    kind: Literal["summary"] = "summary"
    wall_seconds: Seconds
    throughput_tok_s: float = Field(ge=0, le=MAX_COUNT)
    latency_p95_s: Seconds | None = None
    advance_seconds: Seconds | None = None  # the mean time a worker took to advance


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
    with path.open("rb") as f:
        return parse(_bounded_lines(f, str(path)), str(path))


def _bounded_lines(f: IO[bytes], name: str) -> Iterator[str]:
    """The file's lines as text, refusing a line past MAX_LINE or a file past MAX_BYTES
    before either is read whole."""
    total = 0
    for n in itertools.count(1):
        raw = f.readline(MAX_LINE + 1)
        if not raw:
            return
        total += len(raw)
        if len(raw) > MAX_LINE:
            raise TraceError(f"{name}, line {n}: longer than {MAX_LINE} bytes; not a trace")
        if total > MAX_BYTES:
            raise TraceError(f"{name} is larger than {MAX_BYTES} bytes; not a trace")
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TraceError(f"{name}, line {n}: not UTF-8 text") from None


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
        except RecursionError:
            raise TraceError(f"{name}, line {n}: nests too deeply to be a record") from None
        except ValidationError as e:
            raise TraceError(f"{name}, line {n}: {_first(e)}") from None
        except ValueError as e:  # not JSON, or an integer of thousands of digits
            raise TraceError(f"{name}, line {n}: {str(e).splitlines()[0]}") from None


def _first(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = err["loc"][1:] if len(err["loc"]) > 1 else err["loc"]  # past the record's kind
    where = ".".join(str(p) for p in loc)
    record = f" (a {err['loc'][0]} record)" if len(err["loc"]) > 1 else ""
    return f"{where}: {err['msg']}{record}" if where else str(err["msg"])


def unused_path(stem: Path) -> Path:
    """`stem.jsonl`, or `stem.N.jsonl` for the first N free: a control loop that starts
    again (a new operator, a changed scheduler, a resumed run) writes a trace of its own."""
    path, n = stem.with_name(stem.name + ".jsonl"), 0
    while path.exists():
        n += 1
        path = stem.with_name(f"{stem.name}.{n}.jsonl")
    return path


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
