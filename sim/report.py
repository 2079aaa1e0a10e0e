"""What `cadence sim` prints and writes: the pool as deployed, a table and the JSON document.

Every row says at what staleness it ran (`bound/lag`: the policy's staleness bound and the
largest version lag it used), so a reader sees whether two rows are like for like, and
how its moves went (`kv/re-pf`: moves that pulled their KV, moves that re-prefilled).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from rich import box
from rich.table import Table

from cadence.sim.records import Result
from cadence.sim.scenario import GroupDeployment

COLUMNS = (
    ("policy", "policy", "{}"),
    ("throughput_tok_s", "tok/s", "{:,.0f}"),
    ("latency_p50_s", "P50 s", "{:,.1f}"),
    ("latency_p95_s", "P95 s", "{:,.1f}"),
    ("tokens_per_dollar", "tok/$", "{:,.0f}"),
    ("migrations", "moves", "{:,}"),
    ("migrations_kv", "kv", "{:,}"),
    ("migrations_reprefill", "re-pf", "{:,}"),
    ("tool_departures", "tool", "{:,}"),
    ("preemptions", "preempt", "{:,}"),
    ("simulated_seconds", "sim s", "{:,.0f}"),
)


def _cell(value: Any, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def table(results: list[Result], title: str | None = None) -> Table:
    """One row per policy; print it with a rich Console."""
    no_price = any(r.tokens_per_dollar is None for r in results)
    caption = "tok/$ n/a: some accelerator of the pool has no price" if no_price else None
    out = Table(
        title=title,
        caption=caption,
        box=box.SIMPLE_HEAD,
        title_justify="left",
        caption_justify="left",
    )
    for i, (_, label, _) in enumerate(COLUMNS):
        out.add_column(label, justify="left" if i == 0 else "right", no_wrap=True)
    out.add_column("bound/lag", justify="right", no_wrap=True)
    for r in results:
        cells = [_cell(getattr(r, key), fmt) for key, _, fmt in COLUMNS]
        out.add_row(*cells, f"{r.staleness_bound}/{r.max_version_lag}")
    return out


def pool_lines(deployments: Sequence[GroupDeployment]) -> list[str]:
    """One line per group: its devices, its workers and their KV, and why a degree is
    larger than the model needs."""
    out = []
    for g in deployments:
        d = g.deployment
        line = (
            f"{g.group}: {g.devices} x {d.accelerator.name} -> {g.workers} worker(s) of "
            f"tensor-parallel {d.tp}, {d.kv_capacity_tokens:,} KV tokens each"
        )
        out.append(f"{line} ({g.note})" if g.note else line)
    return out


def document(
    scenario: str,
    timing: dict[str, float],
    results: list[Result],
    deployments: Sequence[GroupDeployment] = (),
) -> dict[str, Any]:
    """The JSON `cadence sim --json` writes; `timing` holds its wall and CPU seconds."""
    policies = {}
    skip = {"policy", "timeline", "trace", "extras"}
    for r in results:
        entry = {f.name: getattr(r, f.name) for f in fields(r) if f.name not in skip}
        entry.update(r.extras)
        policies[r.policy] = entry
    doc: dict[str, Any] = {"scenario": scenario, **timing}
    if deployments:
        doc["deployments"] = {g.group: g.summary() for g in deployments}
    doc["policies"] = policies
    return doc
