"""The emulated runtime and the simulator on one YAML file rank two policies the same way
where the margin is wide. On the example's pool every worker has far more KV than its
trajectories need, so Cadence spreads each batch over all four workers, fastest step
first, and keeps two batches in flight, while Sync runs one batch at a time: Cadence
makes about twice Sync's throughput, at a lower P95. The figures themselves (and whether
they agree within 15%) are the bench's to report, not a test's: noise on two cores could
move them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence.bench.agreement import EXAMPLE, measure


@pytest.mark.slow  # emulated runs of two policies
def test_runtime_and_simulator_rank_cadence_first_on_throughput_and_p95(tmp_path: Path) -> None:
    result = measure(EXAMPLE, ["cadence", "sync"], 0.05, 3, tmp_path)
    for side in ("runtime", "simulator"):
        cadence, sync = (result[p][side] for p in ("cadence", "sync"))  # type: ignore[index]
        assert cadence["throughput_tok_s"] > 1.5 * sync["throughput_tok_s"], side
        assert cadence["latency_p95_s"] < sync["latency_p95_s"], side
