"""Workload shape bench: what a scenario's length model actually generates, against the
published targets (p99 about 10x the median; the slowest 10% about half the rollout)."""

from __future__ import annotations

import json
import random
from dataclasses import asdict

from cadence.sim.scenario import Scenario
from cadence.sim.workload import LengthModel, MultiTurn, Sample, generate_group, shape_of


def main(scenario: Scenario, groups: int) -> dict[str, object]:
    """Generate `groups` prompt groups from the scenario's workload and print one JSON line."""
    w = scenario.workload
    rng = random.Random(scenario.seed)
    lengths = LengthModel(
        w.median_response_tokens,
        w.sigma_between_groups,
        w.sigma_within_group,
        scenario.max_model_len,
    )
    turns = MultiTurn(w.multi_turn_share, w.max_tool_calls, w.env_latency_s, w.observation_tokens)
    samples: list[Sample] = []
    for g in range(groups):
        samples += generate_group(
            rng,
            g,
            w.samples_per_prompt,
            prompt_tokens=w.prompt_tokens,
            lengths=lengths,
            multi_turn=turns,
        )
    out: dict[str, object] = {"scenario": scenario.name, "samples": len(samples)}
    out.update(
        {k: round(v, 4) for k, v in asdict(shape_of(samples, scenario.max_model_len)).items()}
    )
    print(json.dumps(out))
    return out
