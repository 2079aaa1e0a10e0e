"""`cadence advise`: the answer printed and written, the frontier drawn, one more worker
of each type priced, and bad input refused in one sentence (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.cli import main
from tests.helpers import TINY_SCENARIO

TINY = ["--scenario", str(TINY_SCENARIO), "--jobs", "1"]


def test_advice_prints_the_pareto_set_and_a_recommendation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "advice.json", tmp_path / "frontier.png"
    argv = ["advise", *TINY, "--available", "A910X=4,BI-V150=4,H800=2"]
    assert main([*argv, "--json", str(out), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "Pareto set within 7.56/h" in printed and "recommended: " in printed
    doc = json.loads(out.read_text())
    assert doc["budget_per_hour"] == pytest.approx(7.56)  # the pool's own cost
    assert doc["reference"]["label"] == "4 x A910X + 4 x BI-V150 + 2 x H800"
    assert doc["recommended"]["latency_p95_s"] <= doc["reference"]["latency_p95_s"]
    assert all(r["cost_per_hour"] <= 7.56 for r in doc["frontier"])
    assert png.stat().st_size > 10_000


def test_marginal_prices_one_more_worker_of_each_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "marginal.json"
    assert main(["advise", *TINY, "--marginal", "--json", str(out)]) == 0
    assert "most throughput per worker: one more H800" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert [r["accelerator"] for r in doc["one_more"]] == ["A910X", "BI-V150", "H800"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--available", "H800=many"], "--available 'H800=many' is not TYPE=NUMBER"),
        (["--budget", "0.5", "--available", "H800=2"], "buys no worker"),
        (["--available", "H20=2"], "no price for H20"),
        (["--eta", "-1"], "--eta is -1"),
        (["--policy", "nope"], "unknown policy nope"),
    ],
)
def test_bad_input_is_exit_2_in_one_sentence(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    assert main(["advise", *TINY, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence: error: ") and err.count("\n") == 1 and says in err


def test_advise_needs_one_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise"]) == 2
    assert "give either --scenario FILE or --trace FILE" in capsys.readouterr().err
