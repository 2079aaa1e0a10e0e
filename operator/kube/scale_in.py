"""Which worker pods leave when a group scales in: never the last worker of a version with
unfinished work, and among the others the cheapest to lose first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScaleInView:
    """What scale-in needs to know of one worker pod."""

    pod: str
    version: int | None
    resident_tokens: int
    residents: int
    source: bool = False  # a concentration source (departure-only)
    ready: bool = True  # Ready and answering; a pending or silent pod serves nobody yet


def choose_for_scale_in(
    workers: Sequence[ScaleInView],
    unfinished_versions: set[int],
    count: int,
    others: Sequence[ScaleInView] = (),
) -> list[str]:
    """Up to `count` of `workers` to remove, one at a time (docs/architecture.md): never the last
    non-source worker of a version with unfinished work, counting the pool's `others`
    too; among the rest, pods that are not ready (pending, unready, silent) first, then a
    concentration source, then the emptiest (fewest resident tokens), then by name.
    Fewer than `count` when the rule protects the rest: the caller waits for work to
    finish."""
    left, chosen = list(workers), list[str]()
    while len(chosen) < count:
        protected = set()
        for v in unfinished_versions:
            serving = [w for w in [*left, *others] if w.version == v and not w.source]
            if len(serving) == 1:
                protected.add(serving[0].pod)
        candidates = [w for w in left if w.pod not in protected]
        if not candidates:
            break
        pick = min(
            candidates,
            key=lambda w: (w.ready, not w.source, w.resident_tokens, w.residents, w.pod),
        )
        chosen.append(pick.pod)
        left.remove(pick)
    return chosen
