"""The simulator's scenario for the resources `cadence run` takes, so one YAML file runs in
both: `cadence sim --scenario trainingrun.yaml` and `cadence run trainingrun.yaml`.

The resources say what the pool and the run are; they do not say what the workload looks
like in time (how long prompts and responses are, how long an update takes). Those come
from `SimWorkload`, whose defaults describe the built-in tasks (prompts of about 28
tokens, every response `maxTokens` long), and are overridden with `cadence sim --set`.
`compression` slows the modelled accelerators as `cadence run --compression` does, so a
simulated run and an emulated one model the same hardware at the same pace.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from cadence.common.catalog import MODELS
from cadence.common.physics import (
    BANDWIDTH_EFFICIENCY,
    DECODE_MFU,
    LINK_BYTES_PER_S,
    PREFILL_MFU,
    STEP_OVERHEAD_S,
)
from cadence.common.trace import Header
from cadence.operator.api.capacity import group_plans, sim_group
from cadence.operator.api.resources import (
    SIZING_DELTA,
    SIZING_H_MIN,
    BatchSpec,
    RolloutPool,
    TrainingRun,
)
from cadence.operator.api.settings import knobs_of
from cadence.sim.laws import MAX_DEVICES
from cadence.sim.scenario import (
    Autoscaling,
    Physics,
    Scenario,
    Scheduling,
    TrainerSettings,
    Workload,
)

# The emulated engine does not model moving the catalog model's weights (it loads the tiny
# model's), so the simulator compared with it sends them from the trainer for free and
# charges an advance what the run's took.
FREE_LINK_GB_S = 1e6


@dataclass(frozen=True, slots=True)
class SimWorkload:
    prompt_tokens: int = 28  # the digits and arithmetic prompts under the tiny tokenizer
    response_tokens: float | None = None  # None: the run's maxTokens
    update_seconds: float = 1.0  # one GRPO update of the tiny model on this machine's CPU
    compression: float = 1.0
    # Trainer to pool. The emulated engine loads the tiny model's real weights and does
    # not model the catalog model's transfer: compare it with a link that costs nothing.
    weights_link_gb_s: float = 2.5
    # How long a worker's advance took on the run being compared (None: the catalog
    # model's weights over `weights_link_gb_s`); the simulator then charges each
    # advance that long.
    advance_seconds: float | None = None


def trace_header(
    pool: RolloutPool, run: TrainingRun, *, policy: str, engine: str, compression: float
) -> Header:
    """A run trace's header: the scenario of the run's resources, as `cadence sim
    --scenario` reads them, with the modelled accelerators at `compression` and weights
    sent for free (a replay charges an advance what the trace's took)."""
    workload = SimWorkload(compression=compression, weights_link_gb_s=FREE_LINK_GB_S)
    return Header(
        scenario=scenario_of(pool, run, workload).model_dump(mode="json", exclude_unset=True),
        policy=policy,
        engine=engine,
        compression=compression,
        started_at=time.time(),
    )


def scenario_of(pool: RolloutPool, run: TrainingRun, w: SimWorkload = SimWorkload()) -> Scenario:
    spec, batch, s = run.spec, run.spec.batch, run.spec.scheduler
    max_len = w.prompt_tokens + batch.max_tokens
    knobs = knobs_of(run)
    need = max_len + knobs.h_min + knobs.delta  # as the operator sizes its workers
    plans = group_plans(pool, run)
    groups = []
    for g in pool.spec.groups:
        tp = plans[g.name][0]
        groups.append(sim_group(g, devices=max(1, g.replicas * tp), plan=plans[g.name]))
    c = w.compression
    if not 0 < c <= 1:
        raise ValueError("the simulator models a compression between 0 and 1 (slower hardware)")
    lengths = batch.response_lengths
    return Scenario(
        name=run.metadata.name,
        seed=lengths.seed if lengths is not None else 0,
        model=spec.model.catalog,
        max_model_len=max_len,
        groups=groups,
        physics=Physics(
            bandwidth_efficiency=BANDWIDTH_EFFICIENCY.value * c,
            prefill_mfu=PREFILL_MFU.value * c,
            decode_mfu=DECODE_MFU.value * c,
            step_overhead_s=STEP_OVERHEAD_S.value / c,
            # Emulated workers of one accelerator type pull a moved trajectory's KV over
            # the modelled cluster link, slowed as their steps are; others re-prefill.
            kv_transfer=True,
            intra_cluster_gb_s=LINK_BYTES_PER_S / 1e9 * c,
            weights_load_gb_s=(
                MODELS[spec.model.catalog].weight_bytes / 1e9 / w.advance_seconds
                if w.advance_seconds
                else w.weights_link_gb_s
            ),
            min_kv_tokens=need,
        ),
        workload=Workload(
            prompts_per_batch=batch.prompts_per_batch,
            samples_per_prompt=batch.samples_per_prompt,
            iterations=batch.iterations,
            prompt_tokens=w.prompt_tokens,
            **_lengths(batch, w),
        ),
        trainer=TrainerSettings(
            update_seconds=w.update_seconds, weights_link_gb_s=w.weights_link_gb_s
        ),
        scheduling=Scheduling(
            eta=s.eta,
            delta=s.delta,
            h_min=s.h_min,
            min_decode=s.min_decode,
            control_period_s=s.control_period_s,
            concentrate_without_fresh=s.concentrate_without_fresh,
            migration=s.migration,
            sizing_h_min=SIZING_H_MIN,
            sizing_delta=SIZING_DELTA,
        ),
    )


def _lengths(batch: BatchSpec, w: SimWorkload) -> dict[str, Any]:
    """The run's length law; without one, every response as long as the workload says
    (the run's measured mean, else maxTokens)."""
    if batch.response_lengths is not None:
        return {"response_lengths": batch.response_lengths.spec()}
    return {
        "median_response_tokens": w.response_tokens or batch.max_tokens,
        "sigma_between_groups": 0.0,
        "sigma_within_group": 0.0,
    }


def with_autoscaling(scenario: Scenario, pool: RolloutPool) -> Scenario:
    """`scenario` resized during its run as the pool's autoscaler would resize it, each
    group between its minReplicas and maxReplicas; unchanged for a pool that does not
    autoscale. (A `cadence run` keeps its pool's size, so its trace header does not.)"""
    a = pool.spec.autoscaling
    if not a.enabled or a.budget_per_hour is None:
        return scenario
    bounds = {g.name: g for g in pool.spec.groups}
    groups = [
        g.model_copy(
            update={
                "min_workers": min(bounds[g.name].min_replicas, MAX_DEVICES),
                "max_workers": max(1, min(bounds[g.name].max_replicas, MAX_DEVICES)),
            }
        )
        for g in scenario.groups
    ]
    autoscaling = Autoscaling(
        budget_per_hour=a.budget_per_hour,
        objective="tail_latency" if a.objective == "tailLatency" else "throughput_per_dollar",
        period_s=a.period_s,
        scale_up_stabilization_s=a.scale_up_stabilization_s,
        scale_down_stabilization_s=a.scale_down_stabilization_s,
        max_step=a.max_step,
        target_utilization=a.target_utilization,
        demand_memory_s=a.demand_memory_s,
    )
    return Scenario.model_validate(
        {
            **scenario.model_dump(exclude_unset=True),
            "groups": [g.model_dump(exclude_unset=True) for g in groups],
            "autoscaling": autoscaling.model_dump(),
        }
    )
