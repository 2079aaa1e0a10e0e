"""The handlers' pure parts: a condition's transition time is when it became so."""

from __future__ import annotations

from cadence.operator.handlers import condition, settled


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
