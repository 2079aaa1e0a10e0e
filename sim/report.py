"""What `cadence sim` prints and writes: a table and the JSON document."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from cadence.sim.core import Result

COLUMNS = (
    ("policy", "policy", "{}"),
    ("throughput_tok_s", "tok/s", "{:,.0f}"),
    ("latency_p50_s", "P50 s", "{:,.1f}"),
    ("latency_p95_s", "P95 s", "{:,.1f}"),
    ("tokens_per_dollar", "tok/$", "{:,.0f}"),
    ("migrations", "moves", "{:,}"),
    ("preemptions", "preempt", "{:,}"),
    ("simulated_seconds", "sim s", "{:,.0f}"),
)


def table(results: list[Result]) -> str:
    rows = [[label for _, label, _ in COLUMNS]]
    for r in results:
        rows.append([fmt.format(getattr(r, key)) for key, _, fmt in COLUMNS])
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def document(scenario: str, wall_seconds: float, results: list[Result]) -> dict[str, Any]:
    policies = {}
    skip = {"policy", "timeline", "extras"}
    for r in results:
        entry = {f.name: getattr(r, f.name) for f in fields(r) if f.name not in skip}
        entry.update(r.extras)
        policies[r.policy] = entry
    return {"scenario": scenario, "wall_seconds": round(wall_seconds, 3), "policies": policies}
