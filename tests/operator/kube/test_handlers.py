"""The handlers without a cluster: a condition's transition time is when it became so;
the run handler never writes a phase over its control loop's."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from cadence.operator.kube.handlers import Reconciler
from cadence.operator.kube.reconciling import condition, settled
from tests.helpers import example

from .memory_kube import MemoryKube


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    before = [
        {
            **condition("Ready", False, "Scaling", "0 of 2 workers ready"),
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        },
        {
            **condition("Degraded", False, "Valid", "the spec is valid"),
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        },
    ]
    now = [
        condition("Ready", True, "Workers", "2 of 2 workers ready"),
        condition("Degraded", False, "Valid", "the spec is valid"),
    ]
    ready, degraded = settled(before, now, generation=3)
    assert ready["observedGeneration"] == degraded["observedGeneration"] == 3
    assert ready["status"] == "True" and ready["lastTransitionTime"] != "2026-01-01T00:00:00Z"
    assert degraded["lastTransitionTime"] == "2026-01-01T00:00:00Z"  # unchanged: kept
    fresh = settled([], [condition("Progressing", True, "Scaling", "0 of 2 workers ready")])
    assert fresh[0]["lastTransitionTime"].endswith("Z")


def test_the_run_handler_leaves_a_running_runs_phase_to_its_control_loop() -> None:
    """The handler may read a run just before its loop writes Succeeded; what it returns
    must not carry a phase that would overwrite it (a run was seen stuck in Running)."""
    kube = MemoryKube()
    kube.put({**example("RolloutPool"), "status": {"run": "digits"}})
    reconciler = Reconciler(kube)
    run = example("TrainingRun")
    run["metadata"].update(namespace="default", uid="d1")  # the server sets the uid
    events: list[tuple[str, str]] = []
    fresh = asyncio.run(reconciler.run(run, events))
    assert fresh["phase"] == "Starting"  # bound now; Running once its control loop runs
    running = asyncio.run(reconciler.run({**run, "status": {"phase": "Running"}}, events))
    assert "phase" not in running and running["conditions"][0]["type"] == "Ready"


class _LoopFinishesMidHandler(MemoryKube):
    """Writes Succeeded into the run's body while the handler makes the trainer's
    objects, as kopf's live body shows the control loop's write to a running handler."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__()
        self.body = body

    async def ensure(self, obj: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        self.body["status"]["phase"] = "Succeeded"
        return await super().ensure(obj)


def test_the_run_handler_decides_on_the_phase_it_was_called_with() -> None:
    """kopf's body is live: the loop's Succeeded may land while the handler runs, and
    the handler must not answer it with Running (a finished run stayed Running, its
    pool never released)."""
    run = example("TrainingRun")
    run["metadata"].update(namespace="default", uid="d1")
    body = {**run, "status": {"phase": "Running"}}
    kube = _LoopFinishesMidHandler(body)
    kube.put({**example("RolloutPool"), "status": {"run": "digits"}})
    status = asyncio.run(Reconciler(kube).run(body, []))
    assert body["status"]["phase"] == "Succeeded" and "phase" not in status
