"""2,000 hostile files through the commands that read files: `cadence run` (a pool and a
run), `cadence sim --trace` and `cadence advise` (a scenario or a trace). Each is broken
in a way a user's mistake, a damaged disk or an attacker would break it: a number past
any bound (10**400, 1e300, inf, nan), a negative count, a wrong type, nesting thousands
deep, a cut-off line, binary bytes. Every one is refused with exit 2 and one sentence on
stderr; none is a traceback, and none starts a run."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cadence.cli import main
from cadence.common.trace import Summary
from tests.common import trace_factories
from tests.helpers import LONGTAIL, TINY_SCENARIO

pytestmark = pytest.mark.slow  # a minute for the 2,000 files

EXAMPLES = 500  # per command: four commands, 2,000 files
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same files in every run: a failure names one to reproduce
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Values no bounded number field takes: past every limit, negative, not finite, or not
# a number at all. (None and booleans are left out: an optional field takes None.)
HOSTILE: list[Any] = [-1, -(10**12), 10**40, 10**400, 1e300, "inf", "nan", "many", [1, 2], {}]
DEEP_JSON = "[" * 100_000 + "]" * 100_000
DEEP_YAML = "[" * 20_000 + "]" * 20_000


def _once(path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (path.read_bytes()[:300], out[-300:], err[-300:])
    assert err.startswith("cadence: error: ") and err.count("\n") == 1, err[-300:]


def _json_text(value: Any) -> str:
    """`value` as JSON, with inf and nan as the bare words Python's json writes."""
    if value == "inf":
        return "Infinity"
    if value == "nan":
        return "NaN"
    return json.dumps(value)


def _yaml_value(value: Any) -> Any:
    return (
        {"inf": float("inf"), "nan": float("nan")}.get(value, value)
        if isinstance(value, str)
        else value
    )


def _set_at(node: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


# --- traces --------------------------------------------------------------------------

_TRACE = trace_factories.trace(
    step_samples=trace_factories.steps("H800", efficiency=0.5, overhead_s=0.01, samples=4)
)
_TRACE_LINES = [
    r.model_dump_json(exclude_none=True)
    for r in [
        _TRACE.header,
        *_TRACE.trajectories[:4],
        *_TRACE.steps,
        *_TRACE.updates,
        Summary(wall_seconds=10, throughput_tok_s=100),
    ]
]
# The bounded numbers of each record kind, as paths into its JSON.
_NUMBERS: dict[str, list[tuple[Any, ...]]] = {
    "trajectory": [
        ("at",),
        ("batch",),
        ("group",),
        ("prompt_tokens",),
        ("turns", 0, "tokens"),
    ],
    "steps": [("at",), ("steps",), ("seconds",), ("sequences",), ("context_tokens",)],
    "update": [("at",), ("version",), ("seconds",)],
    "summary": [("wall_seconds",), ("throughput_tok_s",)],
    "header": [("compression",)],
}


@st.composite
def hostile_traces(draw: st.DrawFn) -> bytes:
    lines = list(_TRACE_LINES)
    n = draw(st.integers(0, len(lines) - 1))
    how = draw(st.sampled_from(["number", "deep", "cut", "binary", "format"]))
    if how == "number":
        record = json.loads(lines[n])
        marker = "\u2063HOSTILE\u2063"
        _set_at(record, draw(st.sampled_from(_NUMBERS[record["kind"]])), marker)
        lines[n] = json.dumps(record).replace(
            json.dumps(marker), _json_text(draw(st.sampled_from(HOSTILE)))
        )
    elif how == "deep":
        lines[n] = DEEP_JSON
    elif how == "cut":
        lines[n] = lines[n][: draw(st.integers(1, len(lines[n]) - 1))]
    elif how == "format":
        lines[0] = lines[0].replace("cadence.trace/1", "cadence.trace/9")
    else:
        return "\n".join(lines).encode() + draw(st.binary(min_size=1, max_size=64)) + b"\xff\n"
    return ("\n".join(lines) + "\n").encode()


@FUZZ
@given(content=hostile_traces())
def test_a_hostile_trace_is_one_sentence_to_sim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(content)
    _once(path, ["sim", "--trace", str(path), "--policies", "cadence"], capsys)


# --- scenarios, through the advisor --------------------------------------------------

_SCENARIO: dict[str, Any] = yaml.safe_load(TINY_SCENARIO.read_text())
_SCENARIO_NUMBERS = [
    ("max_model_len",),
    ("groups", 0, "devices"),
    ("workload", "prompts_per_batch"),
    ("workload", "samples_per_prompt"),
    ("workload", "iterations"),
    ("workload", "median_response_tokens"),
    ("trainer", "update_seconds"),
    ("scheduling", "eta"),
    ("scheduling", "control_period_s"),
    ("physics", "memory_utilisation"),
]


@st.composite
def hostile_scenarios(draw: st.DrawFn) -> bytes:
    how = draw(st.sampled_from(["number", "number", "deep", "binary", "trace"]))
    if how == "deep":
        return DEEP_YAML.encode()
    if how == "binary":
        return b"\xff\xfe" + draw(st.binary(min_size=1, max_size=256))
    if how == "trace":  # a trace where a scenario was expected
        return draw(hostile_traces())
    raw = copy.deepcopy(_SCENARIO)
    path = draw(st.sampled_from(_SCENARIO_NUMBERS))
    _set_at(raw, path, _yaml_value(draw(st.sampled_from(HOSTILE))))
    return yaml.safe_dump(raw).encode()


@FUZZ
@given(content=hostile_scenarios())
def test_a_hostile_scenario_is_one_sentence_to_advise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_bytes(content)
    _once(path, ["advise", "--scenario", str(path), "--budget", "10"], capsys)


@FUZZ
@given(content=hostile_traces())
def test_a_hostile_trace_is_one_sentence_to_advise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(content)
    _once(path, ["advise", "--trace", str(path), "--budget", "10"], capsys)


# --- run files -------------------------------------------------------------------------

_RUN = list(yaml.safe_load_all(LONGTAIL.read_text()))
_RUN_NUMBERS = [
    ("TrainingRun", "spec", "batch", "promptsPerBatch"),
    ("TrainingRun", "spec", "batch", "samplesPerPrompt"),
    ("TrainingRun", "spec", "batch", "maxTokens"),
    ("TrainingRun", "spec", "batch", "iterations"),
    ("TrainingRun", "spec", "scheduler", "eta"),
    ("RolloutPool", "spec", "groups", 0, "affinity"),
    ("RolloutPool", "spec", "groups", 0, "pricePerHour"),
]


@st.composite
def hostile_runs(draw: st.DrawFn) -> bytes:
    how = draw(st.sampled_from(["number", "number", "deep", "binary", "kind"]))
    if how == "deep":
        return DEEP_YAML.encode()
    if how == "binary":
        return draw(st.binary(min_size=1, max_size=256)) + b"\xff"
    docs = copy.deepcopy(_RUN)
    if how == "kind":
        doc = docs[draw(st.integers(0, len(docs) - 1))]
        others = [
            k for k in ("Scenario", None, 7, "TrainingRun", "RolloutPool") if k != doc["kind"]
        ]
        doc["kind"] = draw(st.sampled_from(others))  # another's kind: two of one, none of it
        return yaml.safe_dump_all(docs).encode()
    path = draw(st.sampled_from(_RUN_NUMBERS))
    doc = next(d for d in docs if d["kind"] == path[0])
    _set_at(doc, path[1:], _yaml_value(draw(st.sampled_from(HOSTILE))))
    return yaml.safe_dump_all(docs).encode()


@FUZZ
@given(content=hostile_runs())
def test_a_hostile_run_file_is_one_sentence_and_starts_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    content: bytes,
) -> None:
    from cadence.operator.local import run as local  # noqa: PLC0415

    async def started(*_: object, **__: object) -> None:
        raise AssertionError("a hostile file started a run")

    monkeypatch.setattr(local, "run", started)
    path = tmp_path / "run.yaml"
    path.write_bytes(content)
    _once(path, ["run", str(path), "--workdir", str(tmp_path / "w"), "--no-live"], capsys)
