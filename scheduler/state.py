"""The Cadence policy's memory between cycles.

Only what a snapshot cannot show is kept: which worker is the current departure-only
concentration source of each version (one at a time per version). It is immutable, so a
plan never changes the state it was given and the same (snapshot, state) always gives the
same plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


def _empty() -> Mapping[int, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class CadenceState:
    """`sources` maps a policy version to the worker id of its concentration source."""

    sources: Mapping[int, str] = field(default_factory=_empty)

    @staticmethod
    def of(sources: Mapping[int, str]) -> CadenceState:
        return CadenceState(MappingProxyType(dict(sorted(sources.items()))))

    def source_ids(self) -> frozenset[str]:
        return frozenset(self.sources.values())
