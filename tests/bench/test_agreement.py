"""The emulated runtime and the simulator on one YAML file rank two policies the same way
where the margin is wide: at `eta` 1 Cadence keeps two batches in flight, so its samples
wait for each other about twice as long as Sync's, one batch at a time. The figures
themselves (and whether they agree within 15%) are the bench's to report, not a test's:
noise on two cores could move them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence.bench.agreement import EXAMPLE, measure


@pytest.mark.slow  # emulated runs of two policies
def test_runtime_and_simulator_rank_sync_first_on_p95_latency(tmp_path: Path) -> None:
    result = measure(EXAMPLE, ["cadence", "sync"], 0.05, 3, tmp_path)
    for side in ("runtime", "simulator"):
        cadence = result["cadence"][side]["latency_p95_s"]  # type: ignore[index]
        sync = result["sync"][side]["latency_p95_s"]  # type: ignore[index]
        assert sync < cadence, side
