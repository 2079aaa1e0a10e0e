"""Fuzzing `cadence sim` with broken scenario files: whatever a user gets wrong (a type, a
sign, a missing or unknown key, a huge number, a bad encoding), the answer is one
sentence on stderr and exit 2, never a traceback, and it comes at once."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cadence.cli import main
from tests.helpers import TINY_SCENARIO

TINY = TINY_SCENARIO
BASE: dict[str, Any] = yaml.safe_load(TINY.read_text())

# Numeric fields that must be positive (or non-negative) and have an upper bound, by path.
BOUNDED = [
    ("max_model_len",),
    ("groups", 0, "devices"),
    ("groups", 2, "devices"),
    ("physics", "memory_utilisation"),
    ("physics", "reserve_gb"),
    ("workload", "prompts_per_batch"),
    ("workload", "samples_per_prompt"),
    ("workload", "iterations"),
    ("workload", "median_response_tokens"),
    ("workload", "multi_turn_share"),
    ("trainer", "update_seconds"),
    ("scheduling", "eta"),
    ("scheduling", "delta"),
    ("scheduling", "h_min"),
    ("scheduling", "control_period_s"),
]
REQUIRED = [("name",), ("model",), ("max_model_len",), ("groups",), ("groups", 1, "devices")]
SECTIONS = [(), ("physics",), ("workload",), ("trainer",), ("scheduling",), ("groups", 0)]


def _set(raw: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = raw
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def _drop(raw: dict[str, Any], path: tuple[Any, ...]) -> None:
    node: Any = raw
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]


@st.composite
def broken_files(draw: st.DrawFn) -> bytes:
    raw = copy.deepcopy(BASE)
    kind = draw(st.sampled_from(["type", "sign", "missing", "unknown", "huge", "encoding"]))
    if kind == "type":
        wrong = draw(st.sampled_from(["many", [1, 2], {"a": 1}, "1e3x", None]))
        _set(raw, draw(st.sampled_from(BOUNDED)), wrong)
    elif kind == "sign":
        _set(raw, draw(st.sampled_from(BOUNDED)), -draw(st.integers(1, 10**12)))
    elif kind == "missing":
        _drop(raw, draw(st.sampled_from(REQUIRED)))
    elif kind == "unknown":
        section: Any = raw
        for part in draw(st.sampled_from(SECTIONS)):
            section = section[part]
        section[draw(st.sampled_from(["colour", "devcies", "eta_max", "h-min"]))] = 1
    elif kind == "huge":
        big = draw(st.sampled_from([10**9, 10**18, 10**40, 1e300, float("inf"), float("nan")]))
        _set(raw, draw(st.sampled_from(BOUNDED)), big)
    text = yaml.safe_dump(raw)
    if kind != "encoding":
        return text.encode()
    how = draw(st.sampled_from(["latin-1", "binary", "truncated-utf8"]))
    if how == "latin-1":
        return text.replace("name: tiny", "name: caf\u00e9 tiny").encode("latin-1")
    if how == "binary":
        return b"\xff\xfe" + draw(st.binary(min_size=1, max_size=512))
    return text.encode() + "\u00e9".encode()[:1]


@settings(
    max_examples=80,
    deadline=10_000,  # ms: a refusal is immediate; a run that started would take longer
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(content=broken_files())
def test_a_broken_file_is_one_sentence_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_bytes(content)
    code = main(["sim", "--scenario", str(path), "--policies", "cadence"])
    out, err = capsys.readouterr()
    assert code == 2, (content[:200], out, err)
    assert err.startswith("cadence: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "wall time" not in out
