"""The one percentile every report in Cadence uses, so the simulator, the benches and a
real run quote the same statistic: nearest rank, `values[int(q * n)]` of the sorted values
(0.0 for none)."""

from __future__ import annotations

from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0
