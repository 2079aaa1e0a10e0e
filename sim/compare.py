"""Run one scenario under several policies, each at given settings or at its best over a
sweep of the parameters its source leaves unknown (docs/concepts.md, "The baselines").

Runs are independent and deterministic, so with `jobs` > 1 they run in that many worker
processes at once and give the same results as one after another; each run's batches
are relayed back to the caller's progress as they are consumed.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import queue
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Protocol

from cadence.scheduler.registry import POLICIES, SWEEPS
from cadence.sim.core import Simulation
from cadence.sim.records import Result
from cadence.sim.scenario import Scenario


class UnknownSetting(ValueError):
    """A policy was given a parameter it does not have."""


class Progress(Protocol):
    """Told as each run starts; the callback it returns hears of that run's batches
    consumed (how many, at what simulated time). `cadence sim` draws a bar per run."""

    def run_started(self, label: str, batches: int) -> Callable[[int, float], None]: ...


def make_policy(name: str, settings: Mapping[str, Any]) -> Any:
    factory = POLICIES[name]
    target: Any = getattr(factory, "func", factory)  # functools.partial keeps the class here
    known = {f.name for f in dataclasses.fields(target)} - {"name"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise UnknownSetting(
            f"policy {name} has no parameter {', '.join(unknown)}; "
            f"it has {', '.join(sorted(known)) or 'none'}"
        )
    return factory(**settings)


def run(
    scenario: Scenario,
    names: Sequence[str],
    settings: Mapping[str, Mapping[str, Any]],
    *,
    sweep: bool = False,
    progress: Progress | None = None,
    trace: str | None = None,
    label: str = "",
    jobs: int = 1,
) -> list[Result]:
    """One Result per policy. With `sweep`, a baseline with unknown parameters runs over
    its grid (fixed `settings` still apply) and its best-throughput run is reported, with
    every setting tried under extras["sweep"]. `trace` names a trajectory each run follows
    (Result.trace). `jobs`: how many runs at once, each in its own process."""
    plans: list[tuple[str, list[dict[str, Any]]]] = []
    for name in names:
        fixed = dict(settings.get(name, {}))
        grid = SWEEPS.get(name, []) if sweep else []
        candidates = [{**point, **fixed} for point in grid] or [fixed]
        for point in candidates:
            make_policy(name, point)  # refuse a bad setting before anything runs
        plans.append((name, candidates))
    tasks = [(name, point) for name, candidates in plans for point in candidates]
    labels = [f"{label}{name} {point}" if point else f"{label}{name}" for name, point in tasks]
    if jobs > 1 and len(tasks) > 1:
        outcomes = _in_processes(scenario, tasks, labels, trace, jobs=jobs, progress=progress)
    else:
        outcomes = []
        for (name, point), text in zip(tasks, labels, strict=True):
            on_batch = None
            if progress is not None:
                on_batch = progress.run_started(text, scenario.workload.iterations)
            outcomes.append(_one(scenario, name, point, trace, on_batch))
    results = []
    for _, candidates in plans:
        tried, outcomes = outcomes[: len(candidates)], outcomes[len(candidates) :]
        best = max(tried, key=lambda r: r.throughput_tok_s)
        if len(tried) > 1:
            best.extras["sweep"] = [
                {
                    "settings": r.extras["settings"],
                    "throughput_tok_s": r.throughput_tok_s,
                    "latency_p95_s": r.latency_p95_s,
                    "max_version_lag": r.max_version_lag,
                }
                for r in tried
            ]
        results.append(best)
    return results


def _one(
    scenario: Scenario,
    name: str,
    point: Mapping[str, Any],
    trace: str | None,
    on_batch: Callable[[int, float], None] | None = None,
) -> Result:
    result = Simulation(scenario, make_policy(name, point), trace=trace).run(on_batch=on_batch)
    result.extras["settings"] = dict(point)
    return result


def _relayed(
    scenario: Scenario,
    policy: tuple[str, Mapping[str, Any]],
    trace: str | None,
    task: int,
    events: queue.Queue[tuple[int, int, float]],
) -> Result:
    """A run in a worker process, its batches sent back as (task, consumed, time)."""
    return _one(scenario, *policy, trace, lambda c, t: events.put((task, c, t)))


def _in_processes(
    scenario: Scenario,
    tasks: Sequence[tuple[str, Mapping[str, Any]]],
    labels: Sequence[str],
    trace: str | None,
    *,
    jobs: int,
    progress: Progress | None,
) -> list[Result]:
    # Spawned, not forked: the caller may hold threads (a progress bar's) and locks.
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(jobs, mp_context=context) as pool:
        events: queue.Queue[tuple[int, int, float]] = manager.Queue()
        futures: list[Future[Result]] = []
        callbacks: list[Callable[[int, float], None] | None] = []
        for task, (policy, text) in enumerate(zip(tasks, labels, strict=True)):
            futures.append(pool.submit(_relayed, scenario, policy, trace, task, events))
            started = progress.run_started(text, scenario.workload.iterations) if progress else None
            callbacks.append(started)
        pending: set[Future[Result]] = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            while True:
                try:
                    task, consumed, at = events.get_nowait()
                except queue.Empty:
                    break
                callback = callbacks[task]
                if callback is not None:
                    callback(consumed, at)
        return [f.result() for f in futures]


def with_setting(scenario: Scenario, path: str, value: Any) -> Scenario:
    """A copy of the scenario with one field, named by its dotted path, set to `value`;
    validated again, so a bad path or value raises pydantic's ValidationError. A list of
    named items is entered by an item's name (`groups.h800.devices`) or its index. Only
    what the scenario set, and this field, are given again: a default written out would
    count as given (a length law beside the default lognormal's median)."""
    full = scenario.model_dump()
    raw = scenario.model_dump(exclude_unset=True)
    known: Any = full
    node: Any = raw
    *parents, leaf = path.split(".")
    for part in parents:
        child = _child(known, part)
        if not isinstance(child, dict | list):
            raise UnknownSetting(f"scenario has no section {part!r} in {path!r}")
        known = child
        if isinstance(node, dict) and part not in node:
            node[part] = {} if isinstance(child, dict) else []
        node = _child(node, part)
    if isinstance(known, list) or leaf not in known:
        raise UnknownSetting(f"scenario has no field {path!r}")
    node[leaf] = value
    return Scenario.model_validate(raw)


def _child(node: Any, part: str) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    named = [item for item in node if isinstance(item, dict) and item.get("name") == part]
    if named:
        return named[0]
    if part.isdigit() and int(part) < len(node):
        return node[int(part)]
    names = ", ".join(str(item.get("name")) for item in node if isinstance(item, dict))
    raise UnknownSetting(f"no item named {part!r}; there are {names}")


def vary(
    scenario: Scenario,
    names: Sequence[str],
    path: str,
    values: Sequence[Any],
    *,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    sweep: bool = False,
    progress: Progress | None = None,
    jobs: int = 1,
) -> dict[Any, list[Result]]:
    """Each policy at each value of one scenario field (the paper's eta and delta sweeps)."""
    variants = {v: with_setting(scenario, path, v) for v in values}  # refuse bad input first
    out: dict[Any, list[Result]] = {}
    for value, variant in variants.items():
        out[value] = run(
            variant,
            names,
            settings or {},
            sweep=sweep,
            progress=progress,
            label=f"{path}={value} ",
            jobs=jobs,
        )
    return out
