"""The results page's tables come from the JSON `cadence sim` writes, at equal staleness."""

from __future__ import annotations

import json
from pathlib import Path

from cadence.bench.results import main
from cadence.scheduler.registry import DEFAULT_POLICIES
from cadence.sim import compare
from cadence.sim.report import document
from cadence.sim.scenario import Scenario
from tests.helpers import TINY_SCENARIO

TINY = TINY_SCENARIO


def test_the_tables_quote_each_run_with_its_bound_and_lag(tmp_path: Path) -> None:
    scenario = compare.with_setting(Scenario.load(TINY), "workload.iterations", 2)
    results = compare.run(scenario, DEFAULT_POLICIES, {})
    (tmp_path / "tiny.json").write_text(
        json.dumps(document(scenario.name, {"wall_seconds": 1.0}, results))
    )
    native = compare.run(
        compare.with_setting(scenario, "scheduling.eta", 4), ["cadence", "laminar-native"], {}
    )
    (tmp_path / "tiny-native.json").write_text(
        json.dumps(document(scenario.name, {"wall_seconds": 1.0}, native))
    )

    text = main(tmp_path)
    cadence = next(r for r in results if r.policy == "cadence")
    laminar = next(r for r in results if r.policy == "laminar")
    row = next(line for line in text.splitlines() if line.startswith("| tiny-16A16B8H | "))
    assert f"| {cadence.throughput_tok_s:,.0f} |" in row
    change = (cadence.throughput_tok_s / laminar.throughput_tok_s - 1) * 100
    assert f"| {change:+.0f}% |" in row
    assert f"laminar {laminar.max_version_lag}" in row
    assert "Laminar as its paper ran it" in text
    native_section = text.split("Laminar as its paper ran it")[1]
    native_row = next(
        line for line in native_section.splitlines() if line.startswith("| tiny-16A16B8H | ")
    )
    assert f"{native[0].max_version_lag}, {native[1].max_version_lag} |" in native_row
    assert "| laminar |  |" in text and f"| 1/{laminar.max_version_lag} |" in text

    # The frontier row names every run within the bound that beats Cadence on both.
    beaten = sorted(
        (r for r in results if r.policy != "cadence" and r.max_version_lag <= 1),
        key=lambda r: -r.throughput_tok_s,
    )
    beaten = [
        r
        for r in beaten
        if r.throughput_tok_s > cadence.throughput_tok_s
        and r.latency_p95_s <= cadence.latency_p95_s
    ]
    frontier_row = text.split("## The frontier at equal staleness")[1].splitlines()[4]
    assert frontier_row.startswith("| tiny-16A16B8H | 1 | ")
    assert frontier_row.endswith(f"| {', '.join(r.policy for r in beaten) or 'none'} |")
    summary = json.loads(text.split("```json\n")[1].split("\n```")[0])
    assert summary["pools"] == 1
    assert summary["dominated"] == (["tiny-16A16B8H"] if beaten else [])
