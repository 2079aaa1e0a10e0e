"""`cadence sim`: runs a scenario, writes the JSON document, refuses bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cadence.cli import main
from cadence.cli.sim import load_scenario
from tests.helpers import TINY_SCENARIO, TRAINING_RUN

TINY = TINY_SCENARIO


def test_sim_writes_the_json_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    assert main(["sim", "--scenario", str(TINY), "--policies", "cadence", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["scenario"] == "tiny-16A16B8H"
    assert doc["wall_seconds"] > 0 and doc["cpu_seconds"] > 0
    entry = doc["policies"]["cadence"]
    for key in (
        "throughput_tok_s",
        "latency_p50_s",
        "latency_p95_s",
        "tokens_per_dollar",
        "trajectories",
        "migrations",
        "migrations_kv",
        "migrations_reprefill",
        "migrated_kv_bytes",
        "reprefilled_tokens",
        "reprefilled_kv_bytes",
        "preemptions",
        "simulated_seconds",
    ):
        assert key in entry
    assert entry["trajectories"] == 3 * 16 * 8
    assert entry["migrations"] == entry["migrations_kv"] + entry["migrations_reprefill"]
    assert "cadence" in capsys.readouterr().out


def test_sim_migration_flag_overrides_the_scenario(tmp_path: Path) -> None:
    """--migration reprefill: no move of any policy pulls KV, on a pool where auto does."""
    counts = {}
    for mode in ("auto", "reprefill"):
        out = tmp_path / f"{mode}.json"
        argv = ["sim", "--scenario", str(TINY), "--policies", "cadence", "--json", str(out)]
        assert main([*argv, "--migration", mode]) == 0
        entry = json.loads(out.read_text())["policies"]["cadence"]
        counts[mode] = (entry["migrations_kv"], entry["migrated_kv_bytes"])
    assert counts["auto"][0] > 0 and counts["auto"][1] > 0
    assert counts["reprefill"] == (0, 0.0)


def test_sim_refuses_an_unknown_migration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--scenario", str(TINY), "--migration", "teleport"]) == 2
    assert "--migration" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"groups": [{"name": "x", "accelerator": "TPU9", "devices": 1}]}, "groups[x]"),
        ({"workload": {"iterations": 0}}, "workload.iterations"),
        ({"model": "GPT-9"}, "unknown model"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_scenario_is_exit_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object], message: str
) -> None:
    raw = yaml.safe_load(TINY.read_text())
    raw.update(change)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    assert main(["sim", "--scenario", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence: error: ") and err.count("\n") == 1
    assert message in err


def test_unknown_policy_and_missing_file_are_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--scenario", str(TINY), "--policies", "nope"]) == 2
    assert "available: cadence" in capsys.readouterr().err
    assert main(["sim", "--scenario", "missing.yaml"]) == 2
    assert "cannot read scenario" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--param", "laminar"], "is not POLICY.KEY=VALUE"),
        (["--param", "laminar.bogus=1"], "no parameter bogus"),
        (["--vary", "scheduling.eta"], "is not FIELD=V1,V2"),
        (["--vary", "scheduling.bogus=1,2"], "no field 'scheduling.bogus'"),
        (["--vary", "scheduling.eta=-1"], "scheduling.eta"),
        (["--policies", "cadence", "--param", "cadence.fresh=bogus"], "is not one of"),
        (["--jobs", "0"], "--jobs is 0; it must be at least 1"),
    ],
)
def test_bad_settings_are_exit_2_before_anything_runs(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["sim", "--scenario", str(TINY), "--policies", "laminar", *argv]) == 2
    out, err = capsys.readouterr()
    assert "wall time" not in out
    assert err.startswith("cadence: error: ") and message in err


def test_a_pool_that_could_strand_work_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = yaml.safe_load(TINY.read_text())
    raw.update({"model": "Qwen3-32B", "max_model_len": 30_000})
    raw["physics"]["min_kv_tokens"] = 4_096
    bad = tmp_path / "strand.yaml"
    bad.write_text(yaml.safe_dump(raw))
    assert main(["sim", "--scenario", str(bad), "--policies", "cadence"]) == 2
    assert "could never be placed" in capsys.readouterr().err


def test_bench_workload_reports_the_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "workload", "--scenario", str(TINY), "--groups", "64"]) == 0
    shape = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert shape["samples"] == 64 * 8
    assert shape["p99_over_median"] > 1
    assert 0 < shape["slowest_tenth_time_share"] < 1


def test_a_pinned_floor_below_one_periods_growth_runs_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Qwen3-8B on an H800 at its 256-sequence limit grows thousands of tokens a second.
    argv = ["sim", "--scenario", str(TINY), "--policies", "cadence"]
    assert main([*argv, "--set", "scheduling.h_min=1024"]) == 0
    err = capsys.readouterr().err
    assert "warning: h_min 1,024 is below one control period's growth on group h800" in err
    assert main(argv) == 0  # auto: sized to that growth, nothing to warn of
    assert "warning" not in capsys.readouterr().err
    assert main([*argv, "--set", "scheduling.h_min=-1"]) == 2
    assert "must be auto or a number of tokens" in capsys.readouterr().err


def _autoscaled(tmp_path: Path, budget: float) -> Path:
    """The README's example with its pool autoscaling under `budget` an hour."""
    docs = list(yaml.safe_load_all(TRAINING_RUN.read_text()))
    pool = next(d for d in docs if d["kind"] == "RolloutPool")
    pool["spec"]["autoscaling"] = {"enabled": True, "budgetPerHour": budget}
    pool["spec"]["groups"][0]["maxReplicas"] = 5
    path = tmp_path / "autoscaled.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_a_pools_autoscaling_is_simulated_not_dropped(tmp_path: Path) -> None:
    scenario = load_scenario(_autoscaled(tmp_path, 20.0))
    assert scenario.autoscaling is not None and scenario.autoscaling.budget_per_hour == 20.0
    assert scenario.groups[0].max_workers == 5


def test_an_autoscaling_budget_below_the_pools_cost_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two H800 at 2.0 and two A910X at 1.2: 6.4 an hour as the pool starts.
    assert main(["sim", "--scenario", str(_autoscaled(tmp_path, 5.0))]) == 2
    err = capsys.readouterr().err
    assert "budgetPerHour: 5 is below the pool's starting cost of 6.4 an hour" in err
    assert err.count("\n") == 1
    raw = yaml.safe_load(TINY_SCENARIO.read_text())
    raw["autoscaling"] = {"budget_per_hour": 0.01}
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(raw))
    assert main(["sim", "--scenario", str(scenario)]) == 2
    assert "budget_per_hour 0.01 is below the pool's starting cost" in capsys.readouterr().err
