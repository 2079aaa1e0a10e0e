"""What the scheduler did in a `cadence run`, read from its cycles: the actions it applied
(evictions by reason, placements that moved a trajectory, advances; an action a worker
refused, such as the eviction of a trajectory that finished meanwhile, is left out), the
role each worker played, and where the tail went.

A worker's role at a cycle follows from the versions the pool serves: one that serves an
older version than the newest any worker serves, and still holds residents, is a *tail*
worker (it finishes the old version's long trajectories); one that serves the newest and
holds residents is a *throughput* worker (it takes fresh work); an empty one is idle. A
policy that advances every worker together has no tail workers. The tail's residents are
those held by tail workers; `tail_top_affinity_share` says how many of them sat on the
pool's highest-affinity workers, against `top_affinity_kv_share`, the share of the pool's
KV those workers hold (where the tail would sit if it were spread by capacity).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cadence.worker.api import WorkerState

MAX_EVENTS = 200_000  # a run's event list stops growing here; the counts go on


@dataclass(frozen=True, slots=True)
class Sample:
    """One control cycle's view, for the live display and the report's timeline."""

    at: float  # seconds since the run started
    states: Mapping[str, WorkerState]


def role(state: WorkerState, newest: int | None) -> str:
    """`tail`, `throughput` or `idle`: see the module's docstring."""
    if not state.residents:
        return "idle"
    if newest is not None and state.version is not None and state.version < newest:
        return "tail"
    return "throughput"


def newest_version(states: Mapping[str, WorkerState]) -> int | None:
    """The newest version any of these workers serves (what `role` compares against)."""
    versions = [s.version for s in states.values() if s.version is not None]
    return max(versions) if versions else None


def roles(timeline: Sequence[Sample]) -> dict[str, dict[str, float]]:
    """Seconds each worker spent in each role, a cycle's role lasting until the next."""
    out: dict[str, dict[str, float]] = {}
    for here, after in itertools.pairwise(timeline):
        newest = newest_version(here.states)
        for wid, state in here.states.items():
            seconds, now = out.setdefault(wid, {}), role(state, newest)
            seconds[now] = seconds.get(now, 0.0) + after.at - here.at
    return {
        wid: {r: round(seconds.get(r, 0.0), 1) for r in ("throughput", "tail", "idle")}
        for wid, seconds in sorted(out.items())
    }


def tail_figures(timeline: Sequence[Sample]) -> dict[str, float | int | None]:
    """Where the tail sat: resident-cycles on tail workers, the share of them on the
    pool's highest-affinity workers (None when no worker was ever a tail worker), and
    that share of the pool's KV capacity."""
    top = max((s.affinity for sample in timeline for s in sample.states.values()), default=0)
    capacity: dict[str, tuple[int, int]] = {}  # worker -> (affinity, KV tokens)
    tail = on_top = 0
    for sample in timeline:
        newest = newest_version(sample.states)
        for wid, state in sample.states.items():
            capacity[wid] = (state.affinity, state.kv_capacity_tokens)
            if role(state, newest) == "tail":
                tail += len(state.residents)
                on_top += len(state.residents) if state.affinity == top else 0
    total_kv = sum(kv for _, kv in capacity.values())
    top_kv = sum(kv for affinity, kv in capacity.values() if affinity == top)
    return {
        "tail_resident_cycles": tail,
        "tail_top_affinity_share": round(on_top / tail, 3) if tail else None,
        "top_affinity_kv_share": round(top_kv / total_kv, 3) if total_kv else None,
    }


def action_counts(counts: Mapping[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    """Evictions by reason and placements by kind, from (kind, detail) counts."""
    evictions = {d: n for (k, d), n in counts.items() if k == "evict"}
    return {
        "evictions_by_reason": dict(sorted(evictions.items())),
        "placements_by_kind": {d: counts.get(("place", d), 0) for d in ("fresh", "resume", "move")},
    }
