"""The Cadence policy: one control cycle of pacing and concentration, as a pure function.

`plan(snapshot, state) -> (actions, state)` reads nothing but its arguments: no I/O, no
clock, no randomness. The order of a cycle is

1. admit every group the staleness bound allows;
2. advance empty workers (advance rule, last-host rule);
3. per version, decide the phase: concentration once its short end is exhausted and a
   newer version has fresh work, pacing otherwise; keep or pick the concentration source;
4. restore the floor on every worker (pacing and sources: longest first; concentration
   targets: shortest first);
5. concentration versions: place pending longest first onto targets, then let the source
   depart as fast as targets absorb;
6. pacing versions: place pending shortest first by tight fit, then fresh work the same
   way, oldest batch first, into what is left, except on the workers held for the
   pending trajectories that found no room (one each, the roomiest);
7. pacing versions whose short end is exhausted: move the tail up to faster workers with
   room (work conservation, `lift`).

Trajectories departed in step 4 are pending from that moment and are offered to steps 5
and 6 in the same cycle: a departure commits to a direction, not a target.

Steps 5 to 7 read the move rule (`moves.py`): where two targets are otherwise equal a
departed trajectory goes where it can be pulled (then where the move is cheaper), under
migration kv it goes only where it can be pulled unless no worker of its source's group
serves its version, and work conservation prices each move by its kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from cadence.scheduler.actions import Action, Admit, Advance, Evict, Place
from cadence.scheduler.admission import ShortEnd, groups_to_admit
from cadence.scheduler.concentration import (
    Stream,
    concentrate,
    evict_shortest_to_floor,
    select_source,
)
from cadence.scheduler.errors import ConfigError
from cadence.scheduler.lift import lift_tail
from cadence.scheduler.moves import MoveRule
from cadence.scheduler.pacing import (
    Fit,
    evict_longest_to_floor,
    hold_for_waiting,
    place_by_fit,
)
from cadence.scheduler.snapshot import Knobs, PendingTrajectory, Snapshot
from cadence.scheduler.state import CadenceState
from cadence.scheduler.versions import advance_target, may_leave
from cadence.scheduler.working import WorkingWorker

FreshOrder = Literal["after_pending", "merged"]
BatchOrder = Literal["oldest_first", "mixed"]


@dataclass(frozen=True, slots=True)
class CadencePolicy:
    """Cadence's scheduler. `fit="worst"` is the paper's no-tight-fit ablation, for tests;
    `fit="packed"` the paper's tight fit on every worker, roomy ones included.

    `fresh="after_pending"` (the default) places P_v's trajectories before new work is
    started: the paper's cycle "restores headroom, then places pending work into the
    resulting gaps", and the floor is restored "before new work is admitted". Each pass
    runs shortest first by tight fit, and the fresh pass offers the oldest batch first.
    `fresh="merged"` puts fresh samples into the same ascending order as P_v, batches
    mixed, the paper's literal reading; then fresh work (the shortest) always goes first
    and a departed trajectory waits until its version's short end is exhausted. On
    seed-16A16B8H that reading more than doubled P95 at equal throughput
    (docs/results.md), so it is kept only as an ablation.

    `batches="oldest_first"` (the default) offers every fresh sample of the earliest open
    batch before any of the next; `batches="mixed"` is the ablation that orders the fresh
    pass by length alone, across batches.
    """

    fit: Fit = "tight"
    fresh: FreshOrder = "after_pending"
    batches: BatchOrder = "oldest_first"
    lift: bool = True
    name: str = "cadence"

    def __post_init__(self) -> None:
        for field_name, value, allowed in (
            ("fit", self.fit, get_args(Fit)),
            ("fresh", self.fresh, get_args(FreshOrder)),
            ("batches", self.batches, get_args(BatchOrder)),
        ):
            if value not in allowed:
                raise ConfigError(
                    f"cadence {field_name} {value!r} is not one of {', '.join(allowed)}"
                )
        if not isinstance(self.lift, bool):
            raise ConfigError(f"cadence lift {self.lift!r} is not true or false")

    def initial_state(self) -> CadenceState:
        return CadenceState()

    def staleness_bound(self, eta: int) -> int:
        return eta

    def plan(self, snapshot: Snapshot, state: CadenceState) -> tuple[list[Action], CadenceState]:
        knobs = snapshot.knobs
        actions: list[Action] = []
        admit = groups_to_admit(snapshot)
        if admit:
            actions.append(Admit(admit))

        workers = [WorkingWorker(view, knobs) for view in snapshot.workers]
        actions.extend(_advance_empty(snapshot, state, workers))

        by_version: dict[int, list[WorkingWorker]] = {}
        for w in workers:
            if w.accepting:
                assert w.version is not None
                by_version.setdefault(w.version, []).append(w)

        short_end = ShortEnd(snapshot)
        concentrating = _choose_phases(snapshot, state, by_version, short_end)
        sources = {v: src.id for v, src in concentrating.items() if src is not None}

        departed = _restore_floors(by_version, concentrating, knobs, snapshot.now, actions)
        # Hosts: workers that may take a placement this cycle (sources and advancing
        # workers may not), for the kv knob's "some worker of the group can pull it".
        moves = MoveRule(snapshot, [w.view for w in workers if w.accepting])

        def streams(v: int) -> list[Stream]:
            """P_v's placeable trajectories as observed, and this cycle's departures."""
            observed = snapshot.placeable_by_version.get(v, ())
            out: list[Stream] = [(observed, snapshot.placeable_contexts.get(v, ()))]
            gone = sorted(departed.get(v, ()), key=_length_then_id)
            if gone:
                out.append((gone, [p.context for p in gone]))
            return out

        for version, source in concentrating.items():
            targets = [w for w in by_version[version] if not w.source]
            left = {p.id: p.parked_on for p in departed.get(version, ()) if p.parked_on}
            concentrate(
                source,
                targets,
                streams(version),
                min_decode=knobs.min_decode,
                out=actions,
                left=left,
                moves=moves,
            )
        pacing_workers = {v: ws for v, ws in by_version.items() if v not in concentrating}
        pending = [(v, items) for v in pacing_workers for items, _ in streams(v)]
        passes = (
            [(pending, snapshot.fresh_by_batch)]
            if self.fresh == "merged"
            else [(pending, {}), ([], snapshot.fresh_by_batch)]
        )
        for k, (pending_pass, fresh_pass) in enumerate(passes):
            pool = pacing_workers
            if k == 1:
                placed = {a.trajectory for a in actions if isinstance(a, Place)}
                pool = hold_for_waiting(pacing_workers, pending, placed, moves)
            place_by_fit(
                pool,
                pending_pass,
                fresh_pass,
                eta=knobs.eta,
                out=actions,
                fit=self.fit,
                moves=moves,
                room=knobs.max_model_len,
                oldest_batch_first=k == 1 and self.batches == "oldest_first",
            )
        if self.lift:
            for version, members in pacing_workers.items():
                if short_end.exhausted(version):
                    lift_tail(members, knobs.min_decode, knobs.control_period_s, actions, moves)
        return actions, CadenceState.of(sources)


def _choose_phases(
    snapshot: Snapshot,
    state: CadenceState,
    by_version: dict[int, list[WorkingWorker]],
    short_end: ShortEnd,
) -> dict[int, WorkingWorker | None]:
    """Phase rule: the versions in concentration, each with its source (None if it has no
    second worker to drain onto). Every other version is pacing.

    A version concentrates once its short end is exhausted and a newer version has fresh
    work for the emptied source to start (or the experiment knob says not to wait for
    that); a version already concentrating keeps going while its short end stays
    exhausted and its source still holds residents, so a source is not abandoned
    half-emptied. Once the source has emptied, the next one is chosen only if the trigger
    holds again.
    """
    newest = snapshot.newest_version
    concentrating: dict[int, WorkingWorker | None] = {}
    for version, members in sorted(by_version.items()):
        if version >= newest or not short_end.exhausted(version):
            continue
        kept = state.sources.get(version)
        if not any(w.id == kept and w.count > 0 for w in members):
            kept = None
        if kept is None and not (
            snapshot.knobs.concentrate_without_fresh or short_end.newer_has_fresh(version, newest)
        ):
            continue
        concentrating[version] = _keep_or_select_source(members, kept)
    return concentrating


def _restore_floors(
    by_version: dict[int, list[WorkingWorker]],
    concentrating: dict[int, WorkingWorker | None],
    knobs: Knobs,
    now: float,
    out: list[Action],
) -> dict[int, list[PendingTrajectory]]:
    """Floor rule on every worker below h_min (concentration targets shed their shortest
    residents, everyone else the longest); returns the departures by version, pending
    from this moment."""
    departed: dict[int, list[PendingTrajectory]] = {}
    for version, members in by_version.items():
        targets_here = version in concentrating
        for w in members:
            if w.headroom >= w.floor():
                continue
            first = len(out)
            if targets_here and not w.source:
                evict_shortest_to_floor(w, knobs.min_decode, out)
            else:
                evict_longest_to_floor(w, knobs.min_decode, out)
            for e in out[first:]:
                assert isinstance(e, Evict)
                departed.setdefault(version, []).append(
                    PendingTrajectory(e.trajectory, version, e.context, now, parked_on=w.id)
                )
    return departed


def _advance_empty(
    snapshot: Snapshot, state: CadenceState, workers: Sequence[WorkingWorker]
) -> list[Advance]:
    """Advance every empty worker the rules allow; an advancing worker takes no work now.

    An empty worker (not a source) whose version has placeable pending work stays to take
    it: nothing else but a worker of that version ever can, and leaving would only make
    that work wait. Workers are taken in snapshot order and each move updates the host
    counts, so two empty workers never both leave a version's last host behind.
    """
    unfinished = {w.version for w in workers if w.count and w.version is not None}
    unfinished.update(snapshot.pending_by_version)
    waiting = {v for v, ps in snapshot.placeable_by_version.items() if ps}
    sources = {
        w.id
        for w in workers
        if w.accepting and w.version is not None and state.sources.get(w.version) == w.id
    }
    hosts: dict[int, int] = {}
    for w in workers:
        if w.accepting and w.version is not None and w.id not in sources:
            hosts[w.version] = hosts.get(w.version, 0) + 1
    advances: list[Advance] = []
    for w in workers:
        if w.count or w.view.draining:
            continue
        target = advance_target(w.version, snapshot.newest_version, unfinished, hosts)
        if w.version is not None and target <= w.version:
            continue
        is_source = w.id in sources
        if not is_source and w.version in waiting:
            continue
        if not may_leave(w.version, is_source, unfinished, hosts):
            continue
        if w.version is not None and not is_source:
            hosts[w.version] -= 1
        hosts[target] = hosts.get(target, 0) + 1
        w.accepting = False
        advances.append(Advance(w.id, target))
    return advances


def _keep_or_select_source(
    members: Sequence[WorkingWorker], kept: str | None
) -> WorkingWorker | None:
    """One source at a time per version: keep the current one while it is still valid."""
    chosen: WorkingWorker | None = None
    if len(members) >= 2:
        chosen = next((w for w in members if w.id == kept and w.count > 0), None)
    if chosen is None:
        chosen = select_source(members)
    if chosen is not None:
        chosen.source = True
        chosen.accepting = False
    return chosen


def _length_then_id(p: PendingTrajectory) -> tuple[int, str]:
    return (p.context, p.id)


_DEFAULT = CadencePolicy()


def plan(
    snapshot: Snapshot, state: CadenceState | None = None
) -> tuple[list[Action], CadenceState]:
    """Plan one control cycle with the Cadence policy (tight fit)."""
    return _DEFAULT.plan(snapshot, state if state is not None else CadenceState())
