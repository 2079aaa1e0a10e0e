"""Run traces made to order: a header for the tiny scenario, trajectories of given lengths
in prompt groups, and step samples drawn from a known step model, so a test can check
that a replay recovers what made them."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import yaml

from cadence.common.trace import (
    Header,
    Steps,
    Summary,
    Trace,
    Trajectory,
    TurnSize,
    Update,
)
from cadence.sim.scenario import Scenario
from tests.helpers import TINY_SCENARIO


def tiny_scenario() -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(TINY_SCENARIO.read_text())
    return raw


def header(policy: str = "cadence", **scenario: Any) -> Header:
    return Header(
        scenario={**tiny_scenario(), **scenario},
        policy=policy,
        engine="emulated",
        compression=1.0,
        started_at=0.0,
    )


def trajectories(
    lengths: Sequence[Sequence[int]],
    *,
    prompt_tokens: int = 40,
    tool_seconds: float | None = None,
) -> list[Trajectory]:
    """One trajectory per length, `lengths[g]` the samples of prompt group g; with
    `tool_seconds`, each also waited that long for one observation of 16 tokens."""
    out = []
    for g, group in enumerate(lengths):
        for i, n in enumerate(group):
            turns = [TurnSize(role="model", tokens=n, version=0)]
            if tool_seconds is not None:
                turns.append(TurnSize(role="environment", tokens=16, seconds=tool_seconds))
            out.append(
                Trajectory(
                    at=float(g),
                    id=f"g{g}-s{i}",
                    batch=0,
                    group=g,
                    worker="w0",
                    prompt_tokens=prompt_tokens,
                    turns=turns,
                )
            )
    return out


def steps(
    accelerator: str,
    *,
    efficiency: float,
    overhead_s: float,
    samples: int = 40,
    seed: int = 0,
) -> list[Steps]:
    """Step samples of `accelerator` in the tiny scenario, each the mean of 10 steps at a
    random batch and context, timed by the memory-bound step model with these terms."""
    scenario = Scenario.model_validate(tiny_scenario())
    d = next(
        g.deployment for g in scenario.deployments() if g.deployment.accelerator.name == accelerator
    )
    bw = d.tp * d.accelerator.bandwidth.value * efficiency
    rng = random.Random(seed)
    out = []
    for k in range(samples):
        batch, context = rng.randint(1, 64), rng.randint(1_000, 20_000)
        step = overhead_s + (d.model.weight_bytes + d.model.kv_bytes_per_token * context) / bw
        out.append(
            Steps(
                at=float(k),
                worker=f"{accelerator}-0",
                accelerator=accelerator,
                steps=10,
                seconds=10 * step,
                sequences=10 * batch,
                context_tokens=10 * context,
            )
        )
    return out


def trace(
    lengths: Sequence[Sequence[int]] = ((100, 200, 300, 400),) * 4,
    *,
    step_samples: Sequence[Steps] = (),
    updates: Sequence[float] = (3.0, 5.0),
    summary: Summary | None = None,
    tool_seconds: float | None = None,
) -> Trace:
    return Trace(
        header=header(),
        trajectories=trajectories(lengths, tool_seconds=tool_seconds),
        steps=list(step_samples),
        updates=[Update(at=float(v), version=v + 1, seconds=s) for v, s in enumerate(updates)],
        summary=summary,
    )
