"""What `cadence sim` prints and writes: a table and the JSON document."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from rich import box
from rich.table import Table

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


def table(results: list[Result], title: str | None = None) -> Table:
    """One row per policy; print it with a rich Console."""
    out = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for i, (_, label, _) in enumerate(COLUMNS):
        out.add_column(label, justify="left" if i == 0 else "right", no_wrap=True)
    for r in results:
        out.add_row(*(fmt.format(getattr(r, key)) for key, _, fmt in COLUMNS))
    return out


def document(scenario: str, wall_seconds: float, results: list[Result]) -> dict[str, Any]:
    policies = {}
    skip = {"policy", "timeline", "extras"}
    for r in results:
        entry = {f.name: getattr(r, f.name) for f in fields(r) if f.name not in skip}
        entry.update(r.extras)
        policies[r.policy] = entry
    return {"scenario": scenario, "wall_seconds": round(wall_seconds, 3), "policies": policies}
