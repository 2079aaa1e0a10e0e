"""Autoscale bench: a scenario run with its pool resizing itself (`autoscaling`), beside
fixed pools of the same average cost.

The autoscaled run gives tok/s, P95, tok/$, its mean and highest cost per hour (the
budget is never to be passed). Two fixed pools are put beside it:

- `average_pool`: each group at the number of workers it had on average over the
  autoscaled run, kept for the whole run (the same average cost);
- `best_fixed`: what `cadence advise` finds within that average cost at no worse P95
  than the autoscaled run (the most tok/$ among the fixed mixes of the scenario's types,
  up to each group's `max_workers`); null when no fixed mix within the cost has a P95
  that low.

`ratio` is autoscaled over each. Prints one JSON object.
"""

from __future__ import annotations

import json
from typing import Any

from cadence.sim.advise import AdviceError, Offer, Targets, search
from cadence.sim.compare import make_policy
from cadence.sim.core import Simulation
from cadence.sim.records import Result
from cadence.sim.scenario import Scenario


def _figures(r: Result) -> dict[str, Any]:
    return {
        "throughput_tok_s": round(r.throughput_tok_s, 1),
        "latency_p95_s": round(r.latency_p95_s, 1),
        "tokens_per_dollar": round(r.tokens_per_dollar or 0.0),
    }


def _fixed(scenario: Scenario, workers: dict[str, int]) -> Scenario:
    raw = scenario.model_dump(exclude_unset=True)
    raw.pop("autoscaling")
    tp = {d.group: d.deployment.tp for d in scenario.deployments()}
    raw["groups"] = [
        {**g, "devices": workers[g["name"]] * tp[g["name"]]}
        for g in raw["groups"]
        if workers[g["name"]]
    ]
    return Scenario.model_validate(raw)


def main(scenario: Scenario, jobs: int = 1) -> dict[str, Any]:
    if scenario.autoscaling is None:
        raise ValueError("the scenario has no autoscaling section to compare")
    auto = Simulation(scenario, make_policy("cadence", {})).run()
    scaled = auto.extras["autoscaling"]
    mean_cost = scaled["mean_cost_per_hour"]
    sizes = scaled["sizes"]
    average = {
        g.name: round(sum(s["workers"][g.name] for s in sizes) / len(sizes))
        for g in scenario.groups
    }
    fixed = Simulation(_fixed(scenario, average), make_policy("cadence", {})).run()
    out: dict[str, Any] = {
        "scenario": scenario.name,
        "autoscaled": {
            **_figures(auto),
            "mean_cost_per_hour": mean_cost,
            "max_cost_per_hour": scaled["max_cost_per_hour"],
            "budget_per_hour": scaled["budget_per_hour"],
            "decisions": len(scaled["decisions"]),
        },
        "average_pool": {"workers": average, **_figures(fixed)},
    }
    deployed = {d.group: d for d in scenario.deployments()}
    offers = []
    for g in scenario.groups:
        d = deployed[g.name].deployment
        price = d.accelerator.price_per_hour
        most = g.max_workers if g.max_workers is not None else deployed[g.name].workers
        if price is not None:
            offers.append(Offer(g.accelerator, most * d.tp, price.value))
    base = _fixed(scenario, {g.name: deployed[g.name].workers for g in scenario.groups})
    try:
        advice = search(
            base, offers, mean_cost, targets=Targets(latency_p95_s=auto.latency_p95_s), jobs=jobs
        )
        best = advice.row(advice.recommended) if advice.recommended else None
    except AdviceError as e:
        best = {"refused": str(e)}
    out["best_fixed"] = best
    mine = out["autoscaled"]
    out["ratio"] = {
        name: {
            "tokens_per_dollar": round(mine["tokens_per_dollar"] / other["tokens_per_dollar"], 3),
            "latency_p95_s": round(mine["latency_p95_s"] / other["latency_p95_s"], 3),
        }
        for name, other in (("average_pool", out["average_pool"]), ("best_fixed", best))
        if other and "tokens_per_dollar" in other
    }
    print(json.dumps(out), flush=True)
    return out
