"""The simulated pool resizing itself: each autoscaling period the simulator reads the
signals the operator reads (demand per group from the plan, fresh work waiting, the
staleness bound's room, each group's decode rate), asks the same rule
(`scheduler/autoscale.py`) for each group's target, and adds workers (taking work
`start_s` later) or drains and removes them (idle ones first). The decisions and the
cost over time go into the result's `extras["autoscaling"]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cadence.scheduler.actions import Action
from cadence.scheduler.autoscale import (
    AutoscaleSpec,
    AutoscaleState,
    GroupShape,
    GroupSignal,
    PoolSignal,
    admission_room,
    decide,
    demand,
    fresh_waiting,
)
from cadence.scheduler.snapshot import Snapshot
from cadence.sim.scenario import Scenario

if TYPE_CHECKING:  # the simulation holds the resizer
    from cadence.sim.core import Simulation


class Resizer:
    def __init__(self, scenario: Scenario) -> None:
        a = scenario.autoscaling
        assert a is not None
        self.settings = a
        self.spec = AutoscaleSpec(
            budget_per_hour=a.budget_per_hour,
            objective=a.objective,
            period_s=a.period_s,
            scale_up_stabilization_s=a.scale_up_stabilization_s,
            scale_down_stabilization_s=a.scale_down_stabilization_s,
            max_step=a.max_step,
            target_utilization=a.target_utilization,
            demand_memory_s=a.demand_memory_s,
        )
        self.state = AutoscaleState()
        self.groups = scenario.groups
        self.deployed = scenario.deployments()
        self.replicas = {d.group: d.workers for d in self.deployed}
        self.shapes = [
            GroupShape(g.name, g.affinity, d.deployment.kv_capacity_tokens)
            for g, d in zip(self.groups, self.deployed, strict=True)
        ]
        self.next_at = 0.0
        self.decoded: dict[str, int] = {}  # per group, at the last period
        self.decisions: list[dict[str, Any]] = []
        self.sizes: list[tuple[float, dict[str, int], float]] = []  # (time, workers, $/h)

    def observe(
        self, sim: Simulation, snapshot: Snapshot, actions: Sequence[Action]
    ) -> PoolSignal | None:
        """The pool's signals, once each autoscaling period (None between)."""
        if sim.now < self.next_at:
            return None
        elapsed = self.spec.period_s if self.next_at else 0.0
        self.next_at = sim.now + self.spec.period_s
        waits = demand(snapshot, actions, self.shapes)
        signals = []
        for g, d in zip(self.groups, self.deployed, strict=True):
            members = [w for w in sim.workers.values() if w.group == g.name]
            decoded = sum(w.engine.decoded_tokens for w in members)
            before = self.decoded.get(g.name, decoded)
            self.decoded[g.name] = decoded
            price = d.deployment.accelerator.price_per_hour
            held = [w.engine.assigned() for w in members]
            signals.append(
                GroupSignal(
                    name=g.name,
                    affinity=g.affinity,
                    capacity=d.deployment.kv_capacity_tokens,
                    worker_price=price.value * d.deployment.tp if price is not None else 0.0,
                    workers=len(members),
                    replicas=self.replicas[g.name],
                    min_replicas=g.min_workers,
                    max_replicas=g.max_workers if g.max_workers is not None else d.workers,
                    used_tokens=sum(tokens for _, tokens in held),
                    residents=sum(n for n, _ in held),
                    decode_tok_s=max(0, decoded - before) / elapsed if elapsed else 0.0,
                    pending_tokens=waits[g.name][1],
                    pending_trajectories=waits[g.name][0],
                )
            )
        return PoolSignal(
            tuple(signals), fresh_waiting(snapshot, actions), admission_room(snapshot), sim.now
        )

    def act(self, sim: Simulation, pool: PoolSignal) -> None:
        """Each group to the target the rule decides."""
        decisions, self.state = decide(pool, self.spec, self.state)
        for dec in (d for d in decisions if d.changed):
            self.replicas[dec.group] = dec.replicas
            self.decisions.append(
                {"at": sim.now, "group": dec.group, "replicas": dec.replicas, "reason": dec.reason}
            )
            self._resize(sim, dec.group, dec.replicas)
        sizes = {g.name: 0 for g in self.groups}
        for w in sim.workers.values():
            sizes[w.group] += 1
        self.sizes.append((sim.now, sizes, sim.price_per_hour or 0.0))

    def _resize(self, sim: Simulation, group: str, replicas: int) -> None:
        members = [w for w in sim.workers.values() if w.group == group]
        for _ in range(replicas - len(members)):
            sim.add_worker(group, self.settings.start_s)
        # Let go of the emptiest first: idle ones cost nothing to drain.
        members.sort(key=lambda w: (w.engine.assigned()[1], w.id))
        for w in members[: max(0, len(members) - replicas)]:
            sim.remove_worker(w.id)

    def summary(self, sim: Simulation) -> dict[str, Any]:
        costs = [c for _, _, c in self.sizes]
        hours = sim.now / 3600.0
        return {
            "budget_per_hour": self.spec.budget_per_hour,
            "mean_cost_per_hour": round(sim.dollars / hours, 3) if hours else 0.0,
            "max_cost_per_hour": round(max(costs), 3) if costs else 0.0,
            "decisions": self.decisions,
            "sizes": [{"at": t, "workers": w, "cost_per_hour": c} for t, w, c in self.sizes],
        }
