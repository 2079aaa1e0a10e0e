"""Scenario files: length and latency laws a team can describe or replay, files named
relative to the scenario, one law at a time, and knobs that reach the scheduler."""

from __future__ import annotations

import json
import random
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from cadence.scheduler import CadencePolicy
from cadence.sim import compare
from cadence.sim.core import Simulation
from cadence.sim.scenario import Scenario
from tests.helpers import SCENARIO_DIR, TINY_SCENARIO

TINY = TINY_SCENARIO


def _write(folder: Path, workload: dict[str, Any], **top: Any) -> Path:
    raw = yaml.safe_load(TINY.read_text())
    for key in ("median_response_tokens",):
        raw["workload"].pop(key, None)
    raw["workload"].update(workload)
    raw.update(top)
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _lengths(scenario: Scenario, groups: int = 64) -> list[int]:
    stream = scenario.groups_of_samples(random.Random(scenario.seed))
    return [s.response_tokens for _ in range(groups) for s in next(stream)]


def test_a_mixture_law_in_the_file_shapes_the_workload(tmp_path: Path) -> None:
    mixture = {
        "law": "mixture",
        "components": [
            {"weight": 0.7, "median_tokens": 800},
            {"weight": 0.3, "median_tokens": 12_000},
        ],
    }
    scenario = Scenario.load(_write(tmp_path, {"response_lengths": mixture}))
    lengths = _lengths(scenario, 200)
    assert 0.2 < sum(n > 4_000 for n in lengths) / len(lengths) < 0.4


def test_an_empirical_law_reads_lengths_relative_to_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "lengths.txt").write_text("# recorded\n300\n3000\n\n30000\n")
    law = {"law": "empirical", "path": "lengths.txt"}
    workload = {"response_lengths": law, "multi_turn_share": 0.0}
    lengths = _lengths(Scenario.load(_write(tmp_path, workload)))
    # 30,000 is capped by max_model_len (16,384) less the prompt.
    assert set(lengths) == {300, 3_000, 16_384 - 512}


def test_an_empirical_law_reads_a_field_of_json_lines(tmp_path: Path) -> None:
    rows = [{"id": i, "response_tokens": 100 + i} for i in range(50)]
    (tmp_path / "runs.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    law = {"law": "empirical", "path": "runs.jsonl", "field": "response_tokens"}
    lengths = _lengths(Scenario.load(_write(tmp_path, {"response_lengths": law})))
    assert min(lengths) >= 100 and max(lengths) <= 149


@pytest.mark.parametrize(
    ("content", "field", "says"),
    [
        ("300\nabc\n", None, "line 2 is not a number: 'abc'"),
        ("300\n-4\n", None, "line 2: '-4' is not a positive number"),
        ('{"n": 3}\n{"m": 4}\n', "n", "line 2 is not a JSON object with a number under 'n'"),
        ("# nothing\n", None, "holds no numbers"),
    ],
)
def test_a_bad_lengths_file_is_refused_naming_the_line(
    tmp_path: Path, content: str, field: str | None, says: str
) -> None:
    (tmp_path / "lengths.txt").write_text(content)
    law = {"law": "empirical", "path": "lengths.txt", "field": field}
    with pytest.raises(ValidationError, match=says):
        Scenario.load(_write(tmp_path, {"response_lengths": law}))


def test_a_missing_lengths_file_is_refused(tmp_path: Path) -> None:
    law = {"law": "empirical", "path": "nowhere.txt"}
    with pytest.raises(ValidationError, match=r"cannot read .*nowhere\.txt"):
        Scenario.load(_write(tmp_path, {"response_lengths": law}))


def test_two_length_laws_at_once_are_refused(tmp_path: Path) -> None:
    workload = {
        "median_response_tokens": 900,
        "response_lengths": {"law": "lognormal", "median_tokens": 900},
    }
    with pytest.raises(ValidationError, match="either response_lengths or"):
        Scenario.load(_write(tmp_path, workload))


def test_environment_latency_laws_reach_the_tool_calls(tmp_path: Path) -> None:
    (tmp_path / "latency.txt").write_text("0.25\n7.5\n")
    laws = {
        "lognormal": {"law": "lognormal", "median_s": 3.0, "sigma": 0.5},
        "empirical": {"law": "empirical", "path": "latency.txt"},
    }
    seen = {}
    for name, law in laws.items():
        scenario = Scenario.load(_write(tmp_path, {"multi_turn_share": 1.0, "env_latency": law}))
        stream = scenario.groups_of_samples(random.Random(0))
        seen[name] = sorted(x for _ in range(16) for s in next(stream) for x in s.env_latencies_s)
    assert set(seen["empirical"]) == {0.25, 7.5}
    median = seen["lognormal"][len(seen["lognormal"]) // 2]
    assert 2.5 < median < 3.6


def test_concentrate_without_fresh_reaches_the_policy_knobs(tmp_path: Path) -> None:
    raw = yaml.safe_load(TINY.read_text())
    raw["scheduling"]["concentrate_without_fresh"] = True
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    sim = Simulation(Scenario.load(path), CadencePolicy())
    assert sim.snapshot().knobs.concentrate_without_fresh


def test_two_latency_laws_at_once_are_refused(tmp_path: Path) -> None:
    workload = {"env_latency_s": 3.0, "env_latency": {"law": "exponential", "mean_s": 3.0}}
    with pytest.raises(ValidationError, match="either env_latency or env_latency_s"):
        Scenario.load(_write(tmp_path, workload))


def test_a_recorded_latency_beyond_a_week_is_refused(tmp_path: Path) -> None:
    (tmp_path / "latency.txt").write_text("2.0\n1e9\n")
    law = {"law": "empirical", "path": "latency.txt"}
    with pytest.raises(ValidationError, match="holds a latency above 604800 s"):
        Scenario.load(_write(tmp_path, {"env_latency": law}))


def _fields(model: type[BaseModel]) -> set[str]:
    """Every field of a model and of the models in its fields, by name."""
    out: set[str] = set()
    for name, info in model.model_fields.items():
        out.add(name)
        for inner in _models_in(info.annotation):
            out |= _fields(inner)
    return out


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def test_the_template_names_every_field_and_runs_as_written() -> None:
    template = SCENARIO_DIR / "template.yaml"
    text = template.read_text()
    named = set(re.findall(r"([a-z0-9_]+):", text))
    missing = _fields(Scenario) - named
    assert not missing, f"template.yaml does not name {sorted(missing)}"
    scenario = Scenario.load(template)
    assert [g.price_per_hour for g in scenario.groups] == [2.5, 0.9]
    (result,) = compare.run(scenario, ["cadence"], {})
    assert result.throughput_tok_s > 0 and result.tokens_per_dollar is not None
