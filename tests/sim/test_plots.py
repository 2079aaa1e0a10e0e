"""Plots are written as PNG files from a run's timeline."""

from __future__ import annotations

from pathlib import Path

from cadence.sim import compare, plots
from cadence.sim.scenario import Scenario
from tests.helpers import TINY_SCENARIO

TINY = TINY_SCENARIO


def test_runs_record_a_timeline_and_plots_are_pngs(tmp_path: Path) -> None:
    scenario = Scenario.load(TINY)
    results = compare.run(scenario, ["cadence", "sync"], {}, trace=scenario.traced_sample())
    for r in results:
        assert len(r.timeline) == round(r.simulated_seconds)
        assert sum(s.tokens for s in r.timeline) == r.generated_tokens
    paths = plots.write_all(results, tmp_path / "plots")
    assert {p.name for p in paths} == {
        "throughput_arc.png",
        "context_by_type_cadence.png",
        "context_by_type_sync.png",
        "long_trajectory.png",
    }
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
