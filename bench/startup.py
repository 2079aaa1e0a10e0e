"""Operator start-up bench: how long a fresh interpreter takes to import what `cadence
operator` runs (its kopf handlers and entry point), the peak memory that leaves, and
whether torch came with it. Each figure is from a child process of its own, so nothing
this process imported counts. Run: `python -m cadence.bench.startup`."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, resource, sys, time
t = time.perf_counter()
import cadence.operator.kube.serve, cadence.operator.kube.handlers
print(json.dumps({
    "import_s": round(time.perf_counter() - t, 3),
    "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    "torch_loaded": "torch" in sys.modules,
}))
"""


def main(repeats: int = 3) -> dict[str, object]:
    """The median of `repeats` fresh imports; prints one JSON line."""
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(repeats)
    ]
    runs.sort(key=lambda r: r["import_s"])
    out: dict[str, object] = {"repeats": repeats, **runs[len(runs) // 2]}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
