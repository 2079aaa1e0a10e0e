"""Workload shape bench: what a scenario's length model actually generates, against the
published targets (p99 about 10x the median; the slowest 10% about half the rollout)."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import asdict

from cadence.sim.scenario import Scenario
from cadence.sim.workload import Sample, shape_of


def main(scenario: Scenario, groups: int) -> dict[str, object]:
    """Generate `groups` prompt groups from the scenario's workload and print one JSON line."""
    samples: list[Sample] = []
    replay = scenario.groups_of_samples(random.Random(scenario.seed))
    for group in itertools.islice(replay, groups):
        samples += group
    out: dict[str, object] = {"scenario": scenario.name, "samples": len(samples)}
    out.update(
        {k: round(v, 4) for k, v in asdict(shape_of(samples, scenario.max_model_len)).items()}
    )
    print(json.dumps(out))
    return out
