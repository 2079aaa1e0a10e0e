"""`cadence bench worker-api` serves a real worker on loopback and reports its figures."""

from __future__ import annotations

import json

import pytest

from cadence.cli import main


def test_worker_api_bench_reads_the_state_of_a_decoding_worker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "worker-api", "--residents", "8", "--requests", "20"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["residents"] == 8 and out["requests"] == 20
    assert 0 < out["state_ms_p50"] <= out["state_ms_p99"]
    assert out["engine_steps"] >= 1
