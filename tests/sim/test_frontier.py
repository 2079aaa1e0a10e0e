"""The frontier check: Cadence is dominated only by a run with more throughput and a P95
no higher, at any setting a baseline was run at, within Cadence's staleness bound."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cadence.cli import main
from cadence.sim.frontier import frontier
from tests.helpers import TINY_SCENARIO


def entry(
    tok_s: float,
    p95: float,
    *,
    bound: int = 1,
    lag: int = 1,
    sweep: list[tuple[dict[str, Any], float, float, int]] | None = None,
) -> dict[str, Any]:
    """One policy's entry of a `cadence sim` JSON document."""
    out: dict[str, Any] = {
        "throughput_tok_s": tok_s,
        "latency_p95_s": p95,
        "staleness_bound": bound,
        "max_version_lag": lag,
        "settings": {},
    }
    if sweep is not None:
        out["sweep"] = [
            {"settings": s, "throughput_tok_s": t, "latency_p95_s": p, "max_version_lag": g}
            for s, t, p, g in sweep
        ]
    return out


def test_a_baseline_setting_other_than_its_best_can_dominate() -> None:
    # DORA-like's best throughput (period 10) pays with P95; its period 30 still beats
    # Cadence on both, and that is the run a user would pick.
    dora = entry(
        1_200,
        900,
        sweep=[({"every": 10}, 1_200, 900, 1), ({"every": 30}, 1_050, 380, 1)],
    )
    f = frontier(
        {"cadence": entry(1_000, 400), "dora": dora, "sync": entry(700, 300, bound=0, lag=0)}
    )
    assert f.dominated
    assert [(p.policy, p.settings) for p in f.dominated_by] == [("dora", {"every": 30})]
    assert f.fastest.throughput_tok_s == 1_200
    assert "dominated by dora (every 30)" in f.verdict()
    assert f.to_json()["dominated_by"][0]["latency_p95_s"] == 380


def test_a_trade_is_not_domination() -> None:
    # More throughput at a higher P95, or less throughput at a lower one: a trade.
    f = frontier({"cadence": entry(1_000, 400), "dora": entry(1_030, 520), "sync": entry(800, 300)})
    assert not f.dominated
    assert f.fastest.policy == "dora"
    assert f.throughput_ratio == pytest.approx(1_000 / 1_030)
    assert f.p95_ratio == pytest.approx(400 / 520)
    assert "trades 2.9% of throughput against dora for a P95 23% lower" in f.verdict()


def test_equal_throughput_or_a_run_past_the_bound_does_not_dominate() -> None:
    # AReaL-like trained samples two versions behind where Cadence's bound is one: listed
    # apart, so the reader sees it, but not a loss at equal staleness.
    f = frontier(
        {
            "cadence": entry(1_000, 400),
            "laminar": entry(1_000, 350),
            "areal": entry(1_500, 390, lag=2),
        }
    )
    assert not f.dominated
    assert f.fastest.policy == "cadence"
    assert [p.policy for p in f.beyond_bound] == ["areal"]
    assert "most throughput within bound 1" in f.verdict()
    assert "2 versions behind" in f.verdict()


def test_the_reference_must_have_run() -> None:
    with pytest.raises(ValueError, match="no cadence run"):
        frontier({"dora": entry(1, 1)})


def test_sim_frontier_sweeps_the_baselines_and_writes_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    argv = ["sim", "--scenario", str(TINY_SCENARIO), "--policies", "cadence,dora"]
    assert main([*argv, "--frontier", "--jobs", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["policies"]["dora"]["sweep"]) > 1  # --frontier implies --sweep
    verdict = doc["frontier"]
    assert verdict["reference"] == "cadence"
    cadence, dora = doc["policies"]["cadence"], doc["policies"]["dora"]["sweep"]
    beaten = [
        d
        for d in dora
        if d["throughput_tok_s"] > cadence["throughput_tok_s"]
        and d["latency_p95_s"] <= cadence["latency_p95_s"]
    ]
    assert verdict["dominated"] == bool(beaten)
    assert f"frontier: {verdict['verdict']}" in capsys.readouterr().out


def test_sim_frontier_needs_cadence_and_a_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "--scenario", str(TINY_SCENARIO), "--policies", "dora", "--frontier"]
    assert main(argv) == 2
    assert "name both in --policies" in capsys.readouterr().err


def test_sim_vary_with_frontier_judges_each_value_and_plots_the_trade(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    argv = ["sim", "--scenario", str(TINY_SCENARIO), "--policies", "cadence,dora"]
    argv += ["--set", "workload.iterations=2", "--vary", "scheduling.delta=auto,8192"]
    argv += ["--frontier", "--jobs", "1", "--json", str(out), "--plots", str(tmp_path)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert set(doc["frontier"]) == {"auto", "8192"}
    for value, verdict in doc["frontier"].items():
        cadence = doc["values"][value]["cadence"]
        assert verdict["reference"] == "cadence"
        assert verdict["dominated"] == any(
            d["throughput_tok_s"] > cadence["throughput_tok_s"]
            and d["latency_p95_s"] <= cadence["latency_p95_s"]
            for d in doc["values"][value]["dora"]["sweep"]
        )
    # The reserve moves Cadence; DORA-like does not read it.
    cadence_runs = [doc["values"][v]["cadence"]["throughput_tok_s"] for v in ("auto", "8192")]
    assert cadence_runs[0] != cadence_runs[1]
    dora_runs = [doc["values"][v]["dora"]["sweep"] for v in ("auto", "8192")]
    assert dora_runs[0] == dora_runs[1]
    png = tmp_path / "frontier_scheduling.delta.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
