"""What many tests share and that is not a fixture: the repository's example files, and
one way to wait for something to become true. Tests import it as `tests.helpers` (they run
with `--import-mode=importlib`; `tests/` is a package, so `from tests.helpers import ...`
works from every folder)."""

from __future__ import annotations

import asyncio
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


def eventually(
    predicate: Callable[[], T | Falsy], *, timeout_s: float, what: str, every_s: float = 0.05
) -> T:
    """The first truthy value of `predicate()`, tried every `every_s` for up to
    `timeout_s`; an exception counts as not yet. Fails the test naming `what` was awaited
    and the last value or exception seen."""
    deadline = time.monotonic() + timeout_s
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
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}; {_last(value, error)}")
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
    deadline = time.monotonic() + timeout_s
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
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}; {_last(value, error)}")
        await asyncio.sleep(every_s)
