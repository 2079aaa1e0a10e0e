"""Where the operator writes a run's trace: under its --trace-dir, said in an Event; a
trace it cannot write is a warning Event and no trace, and the run goes on."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from cadence.operator.api.files import load
from cadence.operator.kube.handlers import Reconciler
from cadence.trainer.client import TrainerClient
from tests.helpers import TRAINING_RUN
from tests.operator.kube.memory_kube import MemoryKube


def _reconciler(traces: Path | None) -> tuple[Reconciler, list[tuple[str, str, bool]]]:
    events: list[tuple[str, str, bool]] = []
    r = Reconciler(cast(Any, MemoryKube()), trace_dir=traces)
    r.post = lambda body, reason, message, warning: events.append((reason, message, warning))
    return r, events


@pytest.mark.parametrize("enabled", [True, False])
def test_a_run_is_traced_under_the_trace_dir_unless_it_says_not(
    tmp_path: Path, enabled: bool
) -> None:
    pool, run = load(TRAINING_RUN)
    spec = run.spec.model_copy(
        update={"trace": run.spec.trace.model_copy(update={"enabled": enabled})}
    )
    run = run.model_copy(update={"spec": spec})
    r, events = _reconciler(tmp_path / "traces")
    body = {"metadata": {"name": "digits", "uid": "0123456789ab"}}
    recorder = r._recorder(run, pool, body, cast(TrainerClient, None))
    if not enabled:
        assert recorder is None and events == []
        return
    assert recorder is not None
    recorder.close()
    written = tmp_path / "traces" / run.metadata.namespace / "digits-01234567.jsonl"
    assert written.is_file()
    assert events == [("Tracing", f"the control loop writes its trace to {written}", False)]


def test_a_trace_that_cannot_be_written_is_a_warning_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    pool, run = load(TRAINING_RUN)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    r, events = _reconciler(blocked)
    assert (
        r._recorder(run, pool, {"metadata": {"name": "digits"}}, cast(TrainerClient, None)) is None
    )
    ((reason, message, warning),) = events
    assert reason == "TraceFailed" and warning and message.startswith("cannot write the trace: ")
