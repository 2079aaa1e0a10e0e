"""Which version an empty worker moves to, and when it may not move at all.

A worker serves one version and advances only when empty, never backwards. It goes to
the oldest newer version that still has unfinished work and no worker to host it (other
than a departure-only concentration source), else to the newest published version. New
and replacement workers (no version yet) start by the same rule. The last host of a
version with unfinished work stays, so no trajectory is ever stranded on a version that
no worker serves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def advance_target(
    current: int | None,
    newest: int,
    unfinished: Iterable[int],
    hosts: Mapping[int, int],
) -> int:
    """Advance rule: the version an empty worker now serving `current` should serve.

    `unfinished` are the versions with a trajectory resident or pending; `hosts` counts,
    per version, the workers that may receive its work (not draining, not a source).
    """
    floor = -1 if current is None else current
    for version in sorted(unfinished):
        if floor < version <= newest and hosts.get(version, 0) == 0:
            return version
    return newest


def may_leave(
    current: int | None,
    is_source: bool,
    unfinished: Iterable[int] | set[int],
    hosts: Mapping[int, int],
) -> bool:
    """Last-host rule: the last non-source worker of a version with unfinished work stays."""
    if current is None or is_source:
        return True
    return not (current in unfinished and hosts.get(current, 0) <= 1)
