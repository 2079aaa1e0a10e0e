"""Is Cadence on the throughput/latency frontier of a pool, or does some baseline beat it
on both at once?

A comparison of six policies has two columns a user weighs against each other, throughput
and P95 latency, so "who has the most tok/s" is the wrong question: a policy that wins
throughput by paying twice the P95 is a trade, not a loss. A loss is domination: another
policy with more throughput *and* a P95 at or below Cadence's. Every setting a baseline was
run at counts (each point of its sweep, not only its best-throughput one), since a user
would pick that setting.

Runs are compared at equal staleness: a baseline whose samples trained further behind
than Cadence's bound (AReaL-like's trainer takes whole groups late, by its design) ran a
different contract, so such a point is listed apart and dominates nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Point:
    """One run of one policy at one setting."""

    policy: str
    settings: dict[str, Any]
    throughput_tok_s: float
    latency_p95_s: float
    max_version_lag: int

    def dominates(self, other: Point) -> bool:
        """More throughput, and a P95 no higher."""
        return (
            self.throughput_tok_s > other.throughput_tok_s
            and self.latency_p95_s <= other.latency_p95_s
        )

    def label(self) -> str:
        settings = ", ".join(f"{k} {v}" for k, v in self.settings.items())
        return f"{self.policy} ({settings})" if settings else self.policy

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "settings": self.settings,
            "throughput_tok_s": self.throughput_tok_s,
            "latency_p95_s": self.latency_p95_s,
            "max_version_lag": self.max_version_lag,
        }


@dataclass(frozen=True)
class Frontier:
    """Where the reference policy stands among the others on one pool.

    `dominated_by`: the runs within its bound with more throughput and a P95 no higher,
    most throughput first. `fastest`: the run within the bound with the most throughput
    (the reference itself when it leads). `beyond_bound`: runs that would dominate it but
    trained further behind than its bound allows.
    """

    reference: Point
    bound: int
    dominated_by: tuple[Point, ...]
    fastest: Point
    beyond_bound: tuple[Point, ...]

    @property
    def dominated(self) -> bool:
        return bool(self.dominated_by)

    @property
    def throughput_ratio(self) -> float:
        """Reference's throughput over the fastest run's (1.0 when it leads)."""
        return self.reference.throughput_tok_s / self.fastest.throughput_tok_s

    @property
    def p95_ratio(self) -> float:
        """Reference's P95 over the fastest run's."""
        return self.reference.latency_p95_s / self.fastest.latency_p95_s

    def verdict(self) -> str:
        """One sentence a table or a terminal can show."""
        name = self.reference.policy
        if self.dominated:
            top = self.dominated_by[0]
            return (
                f"{name} is dominated by {', '.join(p.label() for p in self.dominated_by)}: "
                f"{top.policy} makes {top.throughput_tok_s:,.0f} tok/s at P95 "
                f"{top.latency_p95_s:,.1f} s against {self.reference.throughput_tok_s:,.0f} "
                f"at {self.reference.latency_p95_s:,.1f} s"
            )
        if self.fastest is self.reference:
            said = f"{name} is not dominated: it has the most throughput within bound {self.bound}"
        else:
            said = (
                f"{name} is not dominated: it trades {1 - self.throughput_ratio:.1%} of "
                f"throughput against {self.fastest.label()} for a P95 "
                f"{1 - self.p95_ratio:.0%} lower"
            )
        if self.beyond_bound:
            top = self.beyond_bound[0]
            said += (
                f" ({top.label()} beats it on both with samples {top.max_version_lag} "
                f"versions behind, past the bound)"
            )
        return said

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference.policy,
            "bound": self.bound,
            "dominated": self.dominated,
            "dominated_by": [p.to_json() for p in self.dominated_by],
            "fastest": self.fastest.to_json(),
            "throughput_ratio": round(self.throughput_ratio, 4),
            "p95_ratio": round(self.p95_ratio, 4),
            "beyond_bound": [p.to_json() for p in self.beyond_bound],
            "verdict": self.verdict(),
        }


def points(policy: str, entry: Mapping[str, Any]) -> list[Point]:
    """Every run behind one policy's entry of a `cadence sim` JSON document: each setting
    of its sweep, or the one run."""
    tried = entry.get("sweep") or [entry]
    return [
        Point(
            policy,
            dict(t.get("settings") or {}),
            t["throughput_tok_s"],
            t["latency_p95_s"],
            t["max_version_lag"],
        )
        for t in tried
    ]


def frontier(policies: Mapping[str, Mapping[str, Any]], reference: str = "cadence") -> Frontier:
    """Where `reference` stands among the `policies` of a `cadence sim` JSON document
    (`report.document(...)["policies"]`: each entry with its sweep)."""
    if reference not in policies:
        raise ValueError(f"no {reference} run among {', '.join(policies)}")
    ref_entry = policies[reference]
    ref = Point(
        reference,
        dict(ref_entry.get("settings") or {}),
        ref_entry["throughput_tok_s"],
        ref_entry["latency_p95_s"],
        ref_entry["max_version_lag"],
    )
    bound = int(ref_entry["staleness_bound"])
    within: list[Point] = []
    beyond: list[Point] = []
    for name, entry in policies.items():
        if name == reference:
            continue
        for p in points(name, entry):
            (within if p.max_version_lag <= bound else beyond).append(p)
    by_throughput = sorted(within, key=lambda p: -p.throughput_tok_s)
    fastest = by_throughput[0] if by_throughput else ref
    if fastest.throughput_tok_s <= ref.throughput_tok_s:
        fastest = ref
    return Frontier(
        reference=ref,
        bound=bound,
        dominated_by=tuple(p for p in by_throughput if p.dominates(ref)),
        fastest=fastest,
        beyond_bound=tuple(
            sorted((p for p in beyond if p.dominates(ref)), key=lambda p: -p.throughput_tok_s)
        ),
    )
