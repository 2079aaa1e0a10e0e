"""Small readers over a plan's actions, shared by the scheduler tests."""

from __future__ import annotations

from collections.abc import Iterable

from cadence.scheduler import Action, Admit, Advance, Evict, Place


def evictions(actions: Iterable[Action]) -> list[Evict]:
    return [a for a in actions if isinstance(a, Evict)]


def placements(actions: Iterable[Action]) -> list[Place]:
    return [a for a in actions if isinstance(a, Place)]


def advances(actions: Iterable[Action]) -> list[Advance]:
    return [a for a in actions if isinstance(a, Advance)]


def admitted(actions: Iterable[Action]) -> int:
    return sum(a.groups for a in actions if isinstance(a, Admit))


def placed_on(actions: Iterable[Action]) -> dict[str, str]:
    return {p.trajectory: p.worker for p in placements(actions)}


def evicted_from(actions: Iterable[Action]) -> list[tuple[str, str]]:
    return [(e.trajectory, e.worker) for e in evictions(actions)]
