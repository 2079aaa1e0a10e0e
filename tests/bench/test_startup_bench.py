"""The operator start-up bench reports its figures from a fresh interpreter."""

from __future__ import annotations

from cadence.bench.startup import main


def test_the_startup_bench_reports_import_time_memory_and_no_torch() -> None:
    out = main(repeats=1)
    assert out["torch_loaded"] is False
    assert isinstance(out["import_s"], float) and out["import_s"] > 0
    assert isinstance(out["max_rss_mib"], int) and out["max_rss_mib"] > 0
