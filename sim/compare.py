"""Run one scenario under several policies, each at given settings or at its best over a
sweep of the parameters its source leaves unknown (docs/concepts.md, "The baselines")."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cadence.scheduler.registry import POLICIES, SWEEPS
from cadence.sim.core import Simulation
from cadence.sim.records import Result
from cadence.sim.scenario import Scenario


class UnknownSetting(ValueError):
    """A policy was given a parameter it does not have."""


class Progress(Protocol):
    """Told as runs start and batches are consumed; `cadence sim` draws a bar with it."""

    def run_started(self, label: str, batches: int) -> None: ...

    def batch_consumed(self, consumed: int, simulated_s: float) -> None: ...


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
) -> list[Result]:
    """One Result per policy. With `sweep`, a baseline with unknown parameters runs over
    its grid (fixed `settings` still apply) and its best-throughput run is reported, with
    every setting tried under extras["sweep"]. `trace` names a trajectory each run follows
    (Result.trace)."""
    plans: list[tuple[str, list[dict[str, Any]]]] = []
    for name in names:
        fixed = dict(settings.get(name, {}))
        grid = SWEEPS.get(name, []) if sweep else []
        candidates = [{**point, **fixed} for point in grid] or [fixed]
        for point in candidates:
            make_policy(name, point)  # refuse a bad setting before anything runs
        plans.append((name, candidates))
    results = []
    for name, candidates in plans:
        tried = []
        for point in candidates:
            on_batch = None
            if progress is not None:
                progress.run_started(
                    f"{label}{name} {point}" if point else f"{label}{name}",
                    scenario.workload.iterations,
                )
                on_batch = progress.batch_consumed
            sim = Simulation(scenario, make_policy(name, point), trace=trace)
            result = sim.run(on_batch=on_batch)
            result.extras["settings"] = dict(point)
            tried.append(result)
        best = max(tried, key=lambda r: r.throughput_tok_s)
        if len(tried) > 1:
            best.extras["sweep"] = [
                {
                    "settings": r.extras["settings"],
                    "throughput_tok_s": r.throughput_tok_s,
                    "latency_p95_s": r.latency_p95_s,
                }
                for r in tried
            ]
        results.append(best)
    return results


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
) -> dict[Any, list[Result]]:
    """Each policy at each value of one scenario field (the paper's eta and delta sweeps)."""
    variants = {v: with_setting(scenario, path, v) for v in values}  # refuse bad input first
    out: dict[Any, list[Result]] = {}
    for value, variant in variants.items():
        out[value] = run(
            variant, names, settings or {}, sweep=sweep, progress=progress, label=f"{path}={value} "
        )
    return out
