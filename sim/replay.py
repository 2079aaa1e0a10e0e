"""A scenario from a run trace (`common/trace.py`): the run's pool and knobs with the
workload the run actually saw and the step times its workers actually took.

- **Workload.** Response lengths replay the trace's (an empirical law), with the
  within-group correlation estimated from the trace's groups (the intraclass correlation
  of the lengths' normal scores). Prompt length is the trace's mean; the multi-turn share,
  tool calls, observation size and tool latencies are the trace's.
- **Trainer and advances.** The update time is the mean of the trace's updates; an advance
  costs what the run's took on average (the summary's `advance_seconds`).
- **Step model, per accelerator type.** A decode step costs `overhead + max(memory,
  compute)`, the memory term `(weights + KV bytes x context) / (bandwidth x efficiency)`.
  Each `steps` record is one sample: its mean step time at its mean batch and context.
  Two terms are fitted, by least squares weighted by the steps each sample covers: the
  overhead and the bandwidth efficiency (the memory term is linear in its inverse). The
  compute term keeps the scenario's decode MFU: decode at these batch sizes is
  memory-bound, so the samples say nothing about it. The fit's error is reported as the
  step-weighted mean absolute error of the fitted model on the samples, in percent.

The result is an ordinary `Scenario`: `cadence sim --trace` runs it, and writes it as YAML
to be edited (another pool, other knobs) and run with `cadence sim --scenario`.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from cadence.common.catalog import MODELS
from cadence.common.physics import Deployment
from cadence.common.trace import Steps, Trace, Trajectory
from cadence.sim.scenario import Scenario

MIN_SAMPLES = 3  # fewer samples of a type leave its step model as the scenario had it


@dataclass(frozen=True, slots=True)
class StepFit:
    """The step model fitted to one accelerator type's samples."""

    accelerator: str
    samples: int
    steps: int
    bandwidth_efficiency: float
    step_overhead_s: float
    error_pct: float  # step-weighted mean absolute error of the fitted model
    error_before_pct: float  # the same, of the scenario's model before the fit

    def figures(self) -> dict[str, float]:
        """As a scenario group's `efficiency`."""
        return {
            "bandwidth_efficiency": self.bandwidth_efficiency,
            "step_overhead_s": self.step_overhead_s,
        }

    def summary(self) -> dict[str, Any]:
        return {
            "accelerator": self.accelerator,
            "samples": self.samples,
            "steps": self.steps,
            "fitted": {
                "bandwidth_efficiency": round(self.bandwidth_efficiency, 5),
                "step_overhead_s": round(self.step_overhead_s, 6),
            },
            "error_pct": round(self.error_pct, 2),
            "error_before_pct": round(self.error_before_pct, 2),
        }


@dataclass(frozen=True, slots=True)
class Replay:
    scenario: Scenario
    fits: tuple[StepFit, ...]
    trajectories: int

    def summary(self) -> dict[str, Any]:
        w = self.scenario.workload
        return {
            "trajectories": self.trajectories,
            "prompt_tokens": w.prompt_tokens,
            "update_seconds": round(self.scenario.trainer.update_seconds, 3),
            "step_fits": [f.summary() for f in self.fits],
        }


class ReplayError(ValueError):
    """A trace that holds too little to replay; the message says what is missing."""


def replay(trace: Trace) -> Replay:
    """The scenario `trace` describes (errors: ReplayError, pydantic.ValidationError)."""
    done = [t for t in trace.trajectories if not t.failed]
    if not done:
        raise ReplayError("the trace holds no delivered trajectory to take lengths from")
    raw = dict(trace.header.scenario)
    base = Scenario.model_validate(raw)
    workload = {**raw.get("workload", {}), **_workload(done, base.max_model_len)}
    for key in ("median_response_tokens", "sigma_between_groups", "sigma_within_group"):
        workload.pop(key, None)
    trainer = dict(raw.get("trainer", {}))
    if trace.updates:
        trainer["update_seconds"] = statistics.fmean(u.seconds for u in trace.updates)
    physics = dict(raw.get("physics", {}))
    summary = trace.summary
    if summary is not None and summary.advance_seconds:
        weights = MODELS[base.model].weight_bytes
        physics["weights_load_gb_s"] = weights / 1e9 / summary.advance_seconds
    fits = _fits(base, trace.steps)
    by_type = {f.accelerator: f for f in fits}
    groups = [
        g
        if g["accelerator"] not in by_type
        else {**g, "efficiency": by_type[g["accelerator"]].figures()}
        for g in raw["groups"]
    ]
    scenario = Scenario.model_validate(
        {
            **raw,
            "name": f"{base.name}-replay",
            "groups": groups,
            "workload": workload,
            "trainer": trainer,
            "physics": physics,
        }
    )
    return Replay(scenario, fits, len(done))


def _workload(done: list[Trajectory], max_model_len: int) -> dict[str, Any]:
    prompt = round(statistics.fmean(t.prompt_tokens for t in done))
    lengths = [max(1, t.response_tokens) for t in done]
    out: dict[str, Any] = {
        "prompt_tokens": min(max(1, prompt), max_model_len - 1),
        "response_lengths": {
            "law": "empirical",
            "values": lengths,
            "group_correlation": round(group_correlation(done), 4),
        },
    }
    multi = [t for t in done if t.observation_tokens]
    out["multi_turn_share"] = len(multi) / len(done)
    if multi:
        out["max_tool_calls"] = max(len(t.observation_tokens) for t in multi)
        out["observation_tokens"] = round(
            statistics.fmean(n for t in multi for n in t.observation_tokens)
        )
        waits = [s for t in multi for s in t.tool_seconds if s > 0]
        if waits:
            out["env_latency"] = {"law": "empirical", "values": waits}
            out.pop("env_latency_s", None)
    return out


def group_correlation(done: list[Trajectory]) -> float:
    """The intraclass correlation of the lengths' normal scores within prompt groups:
    how much of a length a group shares, as `EmpiricalLengths` draws it (0 to 1)."""
    ranked = sorted(range(len(done)), key=lambda i: done[i].response_tokens)
    n = len(done)
    score = [0.0] * n
    for rank, i in enumerate(ranked):
        score[i] = NormalDist().inv_cdf((rank + 0.5) / n)
    groups: dict[int, list[float]] = defaultdict(list)
    for t, z in zip(done, score, strict=True):
        groups[t.group].append(z)
    sized = [g for g in groups.values() if len(g) > 1]
    if len(sized) < 2:
        return 0.0
    k = statistics.fmean(len(g) for g in sized)
    grand = statistics.fmean(z for g in sized for z in g)
    between = sum(len(g) * (statistics.fmean(g) - grand) ** 2 for g in sized) / (len(sized) - 1)
    within_n = sum(len(g) - 1 for g in sized)
    within = sum((z - statistics.fmean(g)) ** 2 for g in sized for z in g) / within_n
    icc = (between - within) / (between + (k - 1) * within) if between + within > 0 else 0.0
    return min(1.0, max(0.0, icc))


def _fits(base: Scenario, samples: list[Steps]) -> tuple[StepFit, ...]:
    deployments = {g.deployment.accelerator.name: g.deployment for g in base.deployments()}
    by_type: dict[str, list[Steps]] = defaultdict(list)
    for s in samples:
        if s.accelerator in deployments and s.seconds > 0 and s.batch > 0:
            by_type[s.accelerator].append(s)
    return tuple(
        _fit(acc, deployments[acc], rows)
        for acc, rows in sorted(by_type.items())
        if len(rows) >= MIN_SAMPLES
    )


def _fit(accelerator: str, d: Deployment, rows: list[Steps]) -> StepFit:
    """One type's step model: the overhead and bandwidth efficiency that fit its
    samples' step times, the memory term's bytes over the nominal bandwidth."""
    m, bw = d.model, d.tp * d.accelerator.bandwidth.value
    flops = d.tp * d.accelerator.flops.value * d.efficiency.decode_mfu
    memory = [(m.weight_bytes + m.kv_bytes_per_token * s.mean_context) / bw for s in rows]
    compute = [2.0 * m.active_params * s.batch / flops for s in rows]
    measured = [(s.step_s, s.steps) for s in rows]
    overhead, inverse = _line([(x, y, n) for x, (y, n) in zip(memory, measured, strict=True)])
    efficiency = min(1.0, 1.0 / inverse)

    def error(eff: float, over: float) -> float:
        """Step-weighted mean absolute error of a model with these terms, in percent."""
        miss = sum(
            n * abs(over + max(x / eff, c) - y) / y
            for x, c, (y, n) in zip(memory, compute, measured, strict=True)
        )
        return 100.0 * miss / sum(n for _, n in measured)

    return StepFit(
        accelerator=accelerator,
        samples=len(rows),
        steps=sum(n for _, n in measured),
        bandwidth_efficiency=efficiency,
        step_overhead_s=overhead,
        error_pct=error(efficiency, overhead),
        error_before_pct=error(d.efficiency.bandwidth, d.efficiency.step_overhead_s),
    )


def _line(points: list[tuple[float, float, int]]) -> tuple[float, float]:
    """(intercept, slope) of y = a + b x by weighted least squares, with a >= 0 and b > 0:
    a negative intercept is refitted through the origin."""
    w = sum(n for _, _, n in points)
    mx = sum(n * x for x, _, n in points) / w
    my = sum(n * y for _, y, n in points) / w
    sxx = sum(n * (x - mx) ** 2 for x, _, n in points)
    sxy = sum(n * (x - mx) * (y - my) for x, y, n in points)
    if sxx > 0:
        b = sxy / sxx
        a = my - b * mx
        if a >= 0 and b > 0:
            return a, b
    through = sum(n * x * y for x, y, n in points) / sum(n * x * x for x, _, n in points)
    return 0.0, through if through > 0 and math.isfinite(through) else 1.0
