"""The run trace file: what a writer writes a reader reads back whole, and a file that
is not a trace of this version is refused with a sentence naming the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.common.trace import FORMAT, Summary, TraceError, Writer, read

from .trace_factories import header, steps, trajectories


def test_what_is_written_reads_back_in_order(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    made = trajectories([[5, 9]], tool_seconds=0.5)
    samples = steps("H800", efficiency=0.5, overhead_s=0.002, samples=2)
    w = Writer(path, header())
    w.write(*made, *samples)
    w.write(Summary(wall_seconds=10, throughput_tok_s=1.5, latency_p95_s=2.0))
    w.close()
    t = read(path)
    assert t.header.format == FORMAT and t.header.policy == "cadence"
    assert t.trajectories == made and t.steps == samples
    assert [x.response_tokens for x in t.trajectories] == [5, 9]
    assert t.trajectories[0].tool_seconds == [0.5]
    assert t.summary is not None and t.summary.throughput_tok_s == 1.5


def test_a_run_that_died_leaves_a_readable_trace_without_a_summary(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    w = Writer(path, header())
    w.write(*trajectories([[3]]))  # flushed as written: no close
    t = read(path)
    assert len(t.trajectories) == 1 and t.summary is None
    w.close()


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        ([], "does not start with a header"),
        (['{"kind": "summary", "wall_seconds": 1, "throughput_tok_s": 1}'], "header"),
        (["HEADER", "{not json"], "line 2"),
        (["HEADER", '{"kind": "steps", "at": 0}'], "line 2: worker"),
        (["HEADER", '{"kind": "nonsense"}'], "line 2"),
        (["HEADER", "HEADER"], "a second header"),
    ],
)
def test_what_is_not_a_trace_is_refused_naming_the_line(
    tmp_path: Path, lines: list[str], says: str
) -> None:
    head = header().model_dump_json()
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(head if x == "HEADER" else x for x in lines) + "\n")
    with pytest.raises(TraceError, match=says):
        read(path)


def test_another_format_version_is_refused(tmp_path: Path) -> None:
    raw = json.loads(header().model_dump_json())
    raw["format"] = "cadence.trace/9"
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(raw) + "\n")
    with pytest.raises(TraceError, match=r"cadence.trace/9.*reads cadence.trace/1"):
        read(path)
