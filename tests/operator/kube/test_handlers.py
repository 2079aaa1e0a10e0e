"""The handlers without a cluster: a condition's transition time is when it became so;
the run handler never writes a phase over its control loop's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from cadence.operator.kube.handlers import Reconciler, condition, settled

from .memory_kube import MemoryKube

EXAMPLE = Path(__file__).parents[3] / "manifests" / "examples" / "trainingrun.yaml"


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    before = [
        {**condition("Ready", False, "Scaling"), "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {**condition("Degraded", False, "Valid"), "lastTransitionTime": "2026-01-01T00:00:00Z"},
    ]
    after = settled(
        before, [condition("Ready", True, "Workers"), condition("Degraded", False, "Valid")]
    )
    ready, degraded = after
    assert ready["status"] == "True" and ready["lastTransitionTime"] != "2026-01-01T00:00:00Z"
    assert degraded["lastTransitionTime"] == "2026-01-01T00:00:00Z"  # unchanged: kept
    fresh = settled([], [condition("Progressing", True, "Scaling")])
    assert fresh[0]["lastTransitionTime"].endswith("Z")


def _example(kind: str) -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] == kind)


def test_the_run_handler_leaves_a_running_runs_phase_to_its_control_loop() -> None:
    """The handler may read a run just before its loop writes Succeeded; what it returns
    must not carry a phase that would overwrite it (a run was seen stuck in Running)."""
    kube = MemoryKube()
    kube.put({**_example("RolloutPool"), "status": {"run": "digits"}})
    reconciler = Reconciler(kube)
    run = _example("TrainingRun")
    run["metadata"].update(namespace="default", uid="d1")  # the server sets the uid
    events: list[tuple[str, str]] = []
    fresh = asyncio.run(reconciler.run(run, events))
    assert fresh["phase"] == "Running"  # bound now: the handler starts it
    running = asyncio.run(reconciler.run({**run, "status": {"phase": "Running"}}, events))
    assert "phase" not in running and running["conditions"][0]["reason"] == "Bound"
