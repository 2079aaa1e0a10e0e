"""What a policy sees of the pool in one control cycle.

The snapshot is the scheduler's whole input (with the policy's own state): the control
loop, the simulator and tests build it; nothing in it talks to a worker. It holds ids and
lengths only, never tokens (docs/architecture.md, "Where token state lives").

Construction normalises once what every cycle would otherwise redo: residents are kept
longest first, pending trajectories and fresh samples shortest first, and each worker
knows its resident KV. Building a snapshot is the observer's cost; planning over it is the
policy's (the scheduler bench reports both).
"""

from __future__ import annotations

# `_operator` is the C module behind the standard `operator`; imported by that name because
# type checkers run from the repository root see this repository's operator/ folder.
from _operator import add, attrgetter
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from functools import lru_cache, partial
from itertools import repeat
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from cadence.scheduler.cost import StepCost
from cadence.scheduler.errors import ConfigError


class Presorted(NamedTuple):
    """A worker's residents as an engine keeps them: ids longest first (ties by id),
    and each one's context and tokens decoded since placement as an offset from a step
    count they share (every running request grows one token a step, so the order and
    the offsets hold until one joins or leaves). Contexts are `offset + steps`."""

    ids: tuple[str, ...]
    offsets: tuple[int, ...]
    decoded_offsets: tuple[int, ...]
    steps: int = 0


# How a departed trajectory moves to another worker: auto pulls its KV blocks where the
# pair's layouts match (same transfer group) and re-prefills otherwise; kv moves it only
# to a worker that can pull them; reprefill never pulls.
Migration = Literal["auto", "kv", "reprefill"]


class Resident(NamedTuple):
    """A trajectory decoding on a worker.

    `context` is the KV it holds in tokens (prompt + generated so far);
    `decoded_since_placement` counts tokens decoded on this worker since it was placed
    there (the anti-thrash rule reads it).

    A named tuple rather than a frozen dataclass: observers build one per resident per
    cycle (65,536 at a large pool's scale), and a tuple is built in C, at half the cost.
    """

    id: str
    context: int
    decoded_since_placement: int


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as observed: it serves exactly one policy version at a time.

    `version` is None for a worker that holds no weights yet (new or replacement).
    `residents` are stored longest first (ties by id), whatever order they came in.
    `max_seqs` is the engine's sequence limit (vLLM `max_num_seqs`), None if unknown;
    `cost` its decode and prefill cost, None if unknown (then KV alone decides).

    `of_presorted` builds one for an observer that already holds its residents in order
    (the simulator's engines keep them so, see `Presorted`).
    """

    id: str
    accelerator: str
    affinity: int
    version: int | None
    capacity: int
    residents: tuple[Resident, ...] = ()
    draining: bool = False
    max_seqs: int | None = None
    cost: StepCost | None = None
    # Workers with the same (non-None) transfer group have identical KV layouts (model,
    # dtype, block size, parallel layout, accelerator type) and can pull each other's KV
    # blocks; a move between any other pair re-prefills on the destination.
    transfer_group: str | None = None
    used: int = field(init=False)
    count: int = field(init=False)  # how many trajectories it holds
    # Residents' contexts and tokens decoded since placement, shortest first: the
    # concentration rule's "residents shorter than the incoming trajectory" reads these.
    contexts_ascending: tuple[int, ...] = field(init=False, repr=False)
    decoded_ascending: tuple[int, ...] = field(init=False, repr=False)
    least_decoded: int = field(init=False, repr=False)
    _ids_descending: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _presorted: Presorted | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check(self.id, self.capacity, self.max_seqs)
        object.__setattr__(self, "_presorted", None)
        # Longest first, ties by id: two stable C-level sorts, cheaper than one keyed in
        # Python.
        by_id = sorted(self.residents, key=_ID)
        ordered = tuple(sorted(by_id, key=_CONTEXT, reverse=True))
        contexts = tuple(map(_CONTEXT, reversed(ordered)))
        decoded = tuple(map(_DECODED, reversed(ordered)))
        object.__setattr__(self, "residents", ordered)
        object.__setattr__(self, "_ids_descending", ())
        object.__setattr__(self, "used", sum(contexts))
        object.__setattr__(self, "count", len(contexts))
        object.__setattr__(self, "contexts_ascending", contexts)
        object.__setattr__(self, "decoded_ascending", decoded)
        object.__setattr__(self, "least_decoded", min(decoded, default=0))

    @classmethod
    def of_presorted(  # noqa: PLR0917 (the fields of a view)
        cls,
        id: str,
        accelerator: str,
        affinity: int,
        version: int | None,
        capacity: int,
        presorted: Presorted,
        *,
        draining: bool = False,
        max_seqs: int | None = None,
        cost: StepCost | None = None,
        transfer_group: str | None = None,
    ) -> WorkerView:
        """A view of residents held in order: taken without sorting, its arrays and
        `residents` built only when something reads them (most cycles read neither for
        most workers). Built field by field: a frozen dataclass's `__init__` was a fifth
        of the simulator's snapshot time, and every period builds a view per worker."""
        _check(id, capacity, max_seqs)
        ids, offsets, decoded_offsets, steps = presorted
        n = len(ids)
        if not n == len(offsets) == len(decoded_offsets):
            raise ConfigError(f"worker {id}: presorted arrays of unequal lengths")
        view = object.__new__(cls)
        set_ = object.__setattr__
        set_(view, "id", id)
        set_(view, "accelerator", accelerator)
        set_(view, "affinity", affinity)
        set_(view, "version", version)
        set_(view, "capacity", capacity)
        set_(view, "draining", draining)
        set_(view, "max_seqs", max_seqs)
        set_(view, "cost", cost)
        set_(view, "transfer_group", transfer_group)
        set_(view, "used", sum(offsets) + n * steps)
        set_(view, "count", n)
        set_(view, "least_decoded", min(decoded_offsets) + steps if n else 0)
        set_(view, "_ids_descending", ids)
        set_(view, "_presorted", presorted)
        return view  # residents and both arrays: built on first read (__getattr__)

    def __getattr__(self, name: str) -> tuple[Any, ...]:
        # Called only for an attribute not set: what a presorted view builds on first read.
        if name not in _LAZY:
            raise AttributeError(name)
        presorted = self._presorted
        if presorted is None:
            raise AttributeError(name)
        if name == "residents":
            built: tuple[Any, ...] = tuple(
                map(
                    _resident,
                    zip(
                        self._ids_descending,
                        reversed(self.contexts_ascending),
                        reversed(self.decoded_ascending),
                        strict=True,
                    ),
                )
            )
            object.__setattr__(self, "residents", built)
            return built
        steps = repeat(presorted.steps)
        contexts = tuple(map(add, reversed(presorted.offsets), steps))
        decoded = tuple(map(add, reversed(presorted.decoded_offsets), steps))
        object.__setattr__(self, "contexts_ascending", contexts)
        object.__setattr__(self, "decoded_ascending", decoded)
        return contexts if name == "contexts_ascending" else decoded

    @property
    def headroom(self) -> int:
        """H_w: KV capacity minus resident KV, in tokens."""
        return self.capacity - self.used


@dataclass(frozen=True, slots=True)
class PendingTrajectory:
    """A started trajectory in P_v: departed, or waiting for its environment.

    `placeable` is False while it waits for an environment observation. `parked_on` is
    the worker holding its state: policies that send a trajectory back where it was
    (verl's multi-turn requests stick to their server) read it, and the move rule
    (`moves.py`) reads its transfer group: whether a destination can pull the KV.
    """

    id: str
    version: int
    context: int
    since: float
    placeable: bool = True
    parked_on: str | None = None


@dataclass(frozen=True, slots=True)
class FreshSample:
    """An admitted sample that has not started: unbound to any version yet.

    `group` is the admission index of its prompt group; its batch is `group // B`.
    """

    id: str
    group: int
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Admission:
    """Admission counters: groups admitted so far, groups per batch B, and the total."""

    groups_admitted: int
    batch_size: int
    total_groups: int

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch size B is {self.batch_size}; it must be at least 1")
        if self.total_groups < 0 or self.groups_admitted < 0:
            raise ConfigError("admission counters must not be negative")
        if self.groups_admitted > self.total_groups:
            raise ConfigError(
                f"{self.groups_admitted} groups admitted exceeds the total of {self.total_groups}"
            )


@dataclass(frozen=True, slots=True)
class Knobs:
    """The scheduling knobs of a TrainingRun.

    h_min: headroom floor (tokens); delta: per-resident decode reserve (tokens);
    eta: staleness bound (versions); min_decode: anti-thrash minimum, the tokens a
    trajectory decodes after a placement before it may be evicted again (>= 1, so every
    move buys progress); concentrate_without_fresh: start concentration even when no newer
    version has fresh work for the emptied source (an experiment switch, off by default).

    auto_h_min / auto_delta: derive the floor and the reserve per worker each cycle from
    its step cost and `control_period_s` (see `thresholds`); `h_min` and `delta` are then
    what sizes the pool (every worker holds max_model_len + h_min + delta) and what a
    worker of unknown cost gets.

    max_model_len: the longest context a trajectory may reach (the pool's largest), when
    known: a worker with more room than that to spare keeps a gap no trajectory needs,
    so the fit rule spreads work over such workers (`pacing._FitIndex`).
    """

    h_min: int
    delta: int
    eta: int
    min_decode: int = 64
    concentrate_without_fresh: bool = False
    auto_h_min: bool = False
    auto_delta: bool = False
    control_period_s: float = 1.0
    migration: Migration = "auto"
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.h_min < 0:
            raise ConfigError(f"h_min is {self.h_min}; it must be >= 0")
        if self.delta < 0:
            raise ConfigError(f"delta is {self.delta}; it must be >= 0")
        if self.eta < 0:
            raise ConfigError(f"eta is {self.eta}; it must be >= 0")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len is {self.max_model_len}; it must be >= 1")
        if self.min_decode < 1:
            raise ConfigError(
                f"the anti-thrash minimum is {self.min_decode}; it must be >= 1 "
                "or a trajectory could be moved forever without progress"
            )
        if not 0.0 < self.control_period_s < float("inf"):
            raise ConfigError(
                f"the control period is {self.control_period_s} s; it must be finite and > 0"
            )

    @classmethod
    def from_spec(
        cls,
        h_min: int | Literal["auto"],
        delta: int | Literal["auto"],
        *,
        sizing: tuple[int, int],
        eta: int,
        min_decode: int,
        concentrate_without_fresh: bool,
        control_period_s: float,
        migration: Migration = "auto",
        max_model_len: int | None = None,
    ) -> Knobs:
        """Knobs from a spec whose floor and reserve are pinned tokens or "auto": auto is
        derived per worker each cycle, and `sizing` (floor, reserve) sizes the pool."""
        return cls(
            h_min=sizing[0] if h_min == "auto" else h_min,
            delta=sizing[1] if delta == "auto" else delta,
            eta=eta,
            min_decode=min_decode,
            concentrate_without_fresh=concentrate_without_fresh,
            auto_h_min=h_min == "auto",
            auto_delta=delta == "auto",
            control_period_s=control_period_s,
            migration=migration,
            max_model_len=max_model_len,
        )


@dataclass(frozen=True, slots=True)
class Transfer:
    """What a KV pull between two workers of one transfer group costs: the model's KV
    bytes per token of context, and the link's bytes per second. The simulator fills it
    from its catalog; a snapshot without one ranks moves by kind alone (`moves.py`)."""

    kv_bytes_per_token: float
    link_bytes_per_s: float

    def __post_init__(self) -> None:
        for name in ("kv_bytes_per_token", "link_bytes_per_s"):
            value = getattr(self, name)
            if not 0.0 < value < float("inf"):
                raise ConfigError(f"transfer {name} is {value}; it must be finite and > 0")

    def pull_s(self, tokens: int) -> float:
        """Seconds to pull `tokens` of KV over the link."""
        return tokens * self.kv_bytes_per_token / self.link_bytes_per_s


# C-level key getters: snapshots sort tens of thousands of items every cycle.
_ID = attrgetter("id")
_CONTEXT = attrgetter("context")
_DECODED = attrgetter("decoded_since_placement")
# A Resident from an (id, context, decoded) tuple, built in C.
_resident = partial(tuple.__new__, Resident)
PENDING_ORDER = attrgetter("context", "id")
# What a presorted WorkerView builds when it is first read.
_LAZY = frozenset({"residents", "contexts_ascending", "decoded_ascending"})

FRESH_ORDER = attrgetter("prompt_tokens", "id")


@lru_cache(maxsize=1 << 16)  # a pool's ids recur every cycle
def _check(wid: str, capacity: int, max_seqs: int | None) -> None:
    if capacity <= 0:
        raise ConfigError(f"worker {wid} has KV capacity {capacity}; it must be > 0")
    if max_seqs is not None and max_seqs < 1:
        raise ConfigError(f"worker {wid} has max_seqs {max_seqs}; it must be >= 1")


def worker_order(wid: str) -> tuple[str, int]:
    """Sort key of worker ids: the name, then its trailing ordinal as a number (h800-2
    before h800-10, as a pool's groups number their workers)."""
    head, _, tail = wid.rpartition("-")
    return (head, int(tail)) if head and tail.isdigit() else (wid, -1)


def _worker_key(view: WorkerView) -> tuple[str, int]:
    return worker_order(view.id)


class PendingOrder(NamedTuple):
    """P_v as a snapshot reads it, per version (ascending): every pending trajectory and
    the placeable ones, shortest first (ties by id), and the placeable ones' contexts."""

    every: Mapping[int, tuple[PendingTrajectory, ...]]
    placeable: Mapping[int, tuple[PendingTrajectory, ...]]
    contexts: Mapping[int, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The pool at time `now`, plus the run's counters and knobs.

    `pending` is every P_v together (each item names its version); `fresh` is the pool of
    admitted, unstarted samples. Derived indexes (pending by version, shortest first, all
    and placeable only; fresh samples by batch, shortest first) are built once here.
    `workers` are put in `worker_order`: a policy that breaks ties by position
    (round-robin dispatch, first fit) then chooses alike in the control loop and in the
    simulator, whatever order the pool lists its groups in.

    `fresh_index` is for an observer that keeps its fresh samples ordered as they come
    and go (the simulator, whose fresh pool holds thousands of samples): the fresh
    samples of each batch, shortest first (ties by id), batches in the order of their
    shortest sample, exactly what would be built from `fresh`. `pending_index` is the
    same for P_v (`PendingOrder`, kept by `pending_index.py`). Both are taken as given,
    so a cycle does not sort what did not change.
    """

    now: float
    workers: tuple[WorkerView, ...]
    pending: tuple[PendingTrajectory, ...]
    fresh: Sequence[FreshSample]
    newest_version: int
    admission: Admission
    knobs: Knobs
    seed: int = 0
    transfer: Transfer | None = None
    pending_by_version: Mapping[int, tuple[PendingTrajectory, ...]] = field(init=False)
    placeable_by_version: Mapping[int, tuple[PendingTrajectory, ...]] = field(init=False)
    placeable_contexts: Mapping[int, tuple[int, ...]] = field(init=False)
    fresh_by_batch: Mapping[int, tuple[FreshSample, ...]] = field(init=False)
    fresh_index: InitVar[Mapping[int, tuple[FreshSample, ...]] | None] = None
    pending_index: InitVar[PendingOrder | None] = None

    def __post_init__(
        self,
        fresh_index: Mapping[int, tuple[FreshSample, ...]] | None,
        pending_index: PendingOrder | None,
    ) -> None:
        if self.newest_version < 0:
            raise ConfigError(f"newest version is {self.newest_version}; it must be >= 0")
        ordered = tuple(sorted(self.workers, key=_worker_key))
        object.__setattr__(self, "workers", ordered)
        if pending_index is None:
            grouped: dict[int, list[PendingTrajectory]] = {}
            for p in self.pending:
                grouped.setdefault(p.version, []).append(p)
            every = {v: tuple(sorted(grouped[v], key=PENDING_ORDER)) for v in sorted(grouped)}
            placeable = {v: tuple(p for p in ps if p.placeable) for v, ps in every.items()}
            contexts = {v: tuple(p.context for p in ps) for v, ps in placeable.items()}
            pending_index = PendingOrder(every, placeable, contexts)
        elif sum(map(len, pending_index.every.values())) != len(self.pending):
            raise ConfigError("the pending index does not hold the snapshot's pending trajectories")
        if fresh_index is None:
            by_batch: dict[int, list[FreshSample]] = {}
            for f in sorted(self.fresh, key=FRESH_ORDER):
                by_batch.setdefault(f.group // self.admission.batch_size, []).append(f)
            fresh_index = {b: tuple(fs) for b, fs in by_batch.items()}
        elif sum(map(len, fresh_index.values())) != len(self.fresh):
            raise ConfigError("the fresh index does not hold the snapshot's fresh samples")
        object.__setattr__(self, "pending_by_version", MappingProxyType(pending_index.every))
        object.__setattr__(self, "placeable_by_version", MappingProxyType(pending_index.placeable))
        object.__setattr__(self, "placeable_contexts", MappingProxyType(pending_index.contexts))
        object.__setattr__(self, "fresh_by_batch", MappingProxyType(dict(fresh_index)))
