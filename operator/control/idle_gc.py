"""Python's full garbage collection, run in the idle part of a control period.

A loop over a thousand workers holds every worker's state and residents and every
in-flight sample's ledger entry, and a collection of CPython's oldest generation walks
all of them: hundreds of milliseconds on a small machine (`cadence bench loop` reports
the longest as `idle_gc_ms_max`). Left
automatic, it starts whenever allocation crosses a threshold, which is in the middle of
a cycle, since a cycle is when the loop allocates: that cycle's plan and actions wait
for it. While a loop runs, the oldest generation is collected only between cycles, as
often as CPython would have (`due`), and, when the period has not enough idle time left
for one, on a later cycle up to a bound (`overdue`). The young generations stay
automatic: they are cheap, and they free most of what a cycle leaves.

The thresholds are the process's; the last loop to stop puts back what it found.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# Young-generation collections between two of the oldest: CPython's own default
# threshold (its `gc.get_threshold()[2]`), and the most a loop lets pass.
DUE = 10
OVERDUE = 100
# The oldest generation's threshold while loops run: never reached by allocation.
_NEVER = 1 << 30


@dataclass
class _Held:
    loops: int = 0  # loops running in this process
    saved: tuple[int, int, int] | None = None  # the thresholds the first one found


_held = _Held()


@contextmanager
def collecting_between_cycles() -> Iterator[None]:
    """While inside, CPython never collects the oldest generation on its own."""
    if _held.loops == 0:
        _held.saved = saved = gc.get_threshold()
        gc.set_threshold(saved[0], saved[1], _NEVER)
    _held.loops += 1
    try:
        yield
    finally:
        _held.loops -= 1
        if _held.loops == 0 and _held.saved is not None:
            gc.set_threshold(*_held.saved)
            _held.saved = None


@dataclass
class IdleCollector:
    """Decides, after each cycle, whether to collect the oldest generation now."""

    due: int = DUE
    overdue: int = OVERDUE
    last_ms: float = 0.0  # the last full collection's duration

    def after_cycle(self, idle_s: float) -> float:
        """Collect if it is due and fits in `idle_s`, or is overdue; the milliseconds spent."""
        pending = gc.get_count()[2]
        if pending < self.due:
            return 0.0
        if pending < self.overdue and self.last_ms / 1000 > idle_s:
            return 0.0
        started = time.perf_counter()
        gc.collect()
        self.last_ms = (time.perf_counter() - started) * 1000
        return self.last_ms
