"""What many tests share and that is not a fixture: the repository's example files, and
one way to wait for something to become true. Tests import it as `tests.helpers` (they run
with `--import-mode=importlib`; `tests/` is a package, so `from tests.helpers import ...`
works from every folder)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, TypeAlias, TypeVar

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "manifests" / "examples"
TRAINING_RUN = EXAMPLES / "trainingrun.yaml"  # a pool of two groups and a run on it
LONGTAIL = EXAMPLES / "longtail.yaml"  # the main job: long-tailed lengths, small KV
HETEROGENEOUS = EXAMPLES / "heterogeneous.yaml"  # a pool of three accelerator types
SCENARIO_DIR = ROOT / "sim" / "scenarios"
TINY_SCENARIO = SCENARIO_DIR / "tiny-16A16B8H.yaml"

T = TypeVar("T")
Falsy: TypeAlias = Literal[False] | None  # what a predicate returns while not yet: T is the rest


def documents(path: Path = TRAINING_RUN) -> dict[str, dict[str, Any]]:
    """A manifest file's documents by kind (a fresh copy each call: tests edit them)."""
    return {doc["kind"]: doc for doc in yaml.safe_load_all(path.read_text()) if doc}


def example(kind: str, path: Path = TRAINING_RUN) -> dict[str, Any]:
    """One document of an example manifest, by kind (a fresh copy)."""
    return documents(path)[kind]


def _last(value: object, error: BaseException | None) -> str:
    if error is not None:
        return f"the last try raised {type(error).__name__}: {error}"
    shown = repr(value)
    return f"the last value was {shown[:300]}{'...' if len(shown) > 300 else ''}"


MAX_SLOWDOWN = 8.0  # a wait stretches this far at most, inside pytest-timeout's bound


def slowdown() -> float:
    """How much slower than on an idle machine work runs here now: the last minute's load
    average per CPU, from 1 (idle or less) to MAX_SLOWDOWN."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return min(MAX_SLOWDOWN, max(1.0, load / (os.cpu_count() or 1)))


class LoadedDeadline:
    """A wait's budget of `seconds` as an idle machine would spend them: each stretch of
    wall time counts divided by the machine's slowdown at the time, so a test that waits
    on a state passes on a machine loaded ten deep, and still fails when the state never
    comes."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self.last = self.started = clock()
        self.used = 0.0

    def spent(self) -> bool:
        now = self.clock()
        self.used += (now - self.last) / slowdown()
        self.last = now
        return self.used > self.seconds

    def __str__(self) -> str:
        wall = self.last - self.started
        return f"{self.seconds} s" + (
            f" ({wall:.0f} s of a loaded machine)" if wall > self.seconds + 1 else ""
        )


def eventually(
    predicate: Callable[[], T | Falsy], *, timeout_s: float, what: str, every_s: float = 0.05
) -> T:
    """The first truthy value of `predicate()`, tried every `every_s` for up to
    `timeout_s`; an exception counts as not yet. Fails the test naming `what` was awaited
    and the last value or exception seen."""
    budget = LoadedDeadline(timeout_s)
    while True:
        error: BaseException | None = None
        value: Any = None
        try:
            value = predicate()
        except Exception as e:
            error = e
        else:
            if value:
                return value  # type: ignore[no-any-return]
        if budget.spent():
            pytest.fail(f"not within {budget}: {what}; {_last(value, error)}")
        time.sleep(every_s)


async def eventually_async(
    predicate: Callable[[], Awaitable[T | Falsy]],
    *,
    timeout_s: float,
    what: str,
    every_s: float = 0.05,
) -> T:
    """`eventually` for a coroutine predicate, awaited on the running loop (which the
    waiting does not block)."""
    budget = LoadedDeadline(timeout_s)
    while True:
        error: BaseException | None = None
        value: Any = None
        try:
            value = await predicate()
        except Exception as e:
            error = e
        else:
            if value:
                return value  # type: ignore[no-any-return]
        if budget.spent():
            pytest.fail(f"not within {budget}: {what}; {_last(value, error)}")
        await asyncio.sleep(every_s)


def reconciles_of(metrics: Any, plural: str, name: str, namespace: str = "default") -> float:
    """How many times the operator has reconciled one object to the end, read from its
    `cadence_operator_reconciles` metric as Prometheus would."""
    for family in metrics.collect():
        if family.name != "cadence_operator_reconciles":
            continue
        for sample in family.samples:
            wanted = {"kind": plural, "namespace": namespace, "name": name}
            if sample.name.endswith("_total") and sample.labels == wanted:
                return float(sample.value)
    return 0.0
