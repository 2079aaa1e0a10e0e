"""Which accelerators to rent for a workload and a budget: pool mixes searched with the
simulator running the real policy.

A mix is a number of workers of each offered accelerator type (a worker spans the devices
its tensor-parallel degree needs). Every mix within the budget and the devices offered is
a candidate; there are thousands, and one full simulation of a seed-sized pool takes
seconds, so the search is successive halving over a coarse-to-fine grid:

1. a coarse grid (about five levels per type) runs at low fidelity (the first batches of
   the run, not all of them);
2. the best quarter survive, ranked by Pareto rank over (tok/s, P95, tok/$), then tok/$;
   the grid around each survivor is refined (half the step) and the new neighbours run,
   again at low fidelity; this repeats until the step is one worker;
3. the survivors, and the scenario's own pool when it is within the offer, run at full
   fidelity, and only those results are reported.

The answer is the Pareto set of the full runs and one recommended mix: the most tok/$
among the mixes that meet the targets (a P95 no worse than the reference pool's, or the
one asked for; at least the tok/s asked for). `marginal` answers the other question a
user asks: what one more worker of each type buys on the pool as it is.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from cadence.common.catalog import ACCELERATORS
from cadence.sim.compare import make_policy
from cadence.sim.core import Simulation
from cadence.sim.scenario import Group, Scenario

LEVELS = 5  # coarse grid levels per type, zero included
KEEP = 0.25  # the share of a round's candidates that survive it
MIN_KEEP = 6
FINAL = 10  # mixes run at full fidelity


class AdviceError(ValueError):
    """Inputs no mix can satisfy; the message says which."""


@dataclass(frozen=True, slots=True)
class Offer:
    """Devices of one type that may be rented, and their price per device-hour."""

    accelerator: str
    devices: int
    price_per_hour: float


@dataclass(frozen=True, slots=True)
class Kind:
    """An offered type as a worker: its tensor-parallel degree, price and affinity."""

    accelerator: str
    tp: int
    max_workers: int
    worker_price: float
    affinity: int
    template: Group  # the scenario's group of this type, or one made for it


Mix = tuple[int, ...]  # workers per kind, in the order of `Search.kinds`


@dataclass(frozen=True, slots=True)
class Outcome:
    mix: Mix
    iterations: int
    throughput_tok_s: float
    latency_p95_s: float
    cost_per_hour: float

    @property
    def tokens_per_dollar(self) -> float:
        return self.throughput_tok_s * 3600.0 / self.cost_per_hour

    def dominates(self, other: Outcome) -> bool:
        """At least as good on tok/s, P95 and tok/$, and better on one."""
        mine = (self.throughput_tok_s, -self.latency_p95_s, self.tokens_per_dollar)
        theirs = (other.throughput_tok_s, -other.latency_p95_s, other.tokens_per_dollar)
        return all(a >= b for a, b in zip(mine, theirs, strict=True)) and mine != theirs


@dataclass(frozen=True, slots=True)
class Targets:
    latency_p95_s: float | None = None
    throughput_tok_s: float | None = None

    def met(self, o: Outcome) -> bool:
        return (self.latency_p95_s is None or o.latency_p95_s <= self.latency_p95_s) and (
            self.throughput_tok_s is None or o.throughput_tok_s >= self.throughput_tok_s
        )


@dataclass
class Advice:
    kinds: tuple[Kind, ...]
    budget_per_hour: float
    frontier: list[Outcome]
    recommended: Outcome | None
    reason: str
    reference: Outcome | None  # the scenario's own pool, where the offer holds it
    evaluated: int  # simulations run, all fidelities
    full_iterations: int
    targets: Targets = field(default_factory=Targets)
    finals: list[Outcome] = field(default_factory=list)  # every mix run at full fidelity

    def describe(self, mix: Mix) -> str:
        """`8 x H800 + 4 x BI-V150 (tp 2)`: workers of each type, and a degree above one."""
        return " + ".join(
            f"{n} x {k.accelerator}" + (f" (tp {k.tp})" if k.tp > 1 else "")
            for n, k in zip(mix, self.kinds, strict=True)
            if n
        )

    def row(self, o: Outcome) -> dict[str, Any]:
        return {
            "mix": {k.accelerator: n for n, k in zip(o.mix, self.kinds, strict=True)},
            "devices": {k.accelerator: n * k.tp for n, k in zip(o.mix, self.kinds, strict=True)},
            "label": self.describe(o.mix),
            "throughput_tok_s": round(o.throughput_tok_s, 1),
            "latency_p95_s": round(o.latency_p95_s, 2),
            "tokens_per_dollar": round(o.tokens_per_dollar),
            "cost_per_hour": round(o.cost_per_hour, 2),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "budget_per_hour": self.budget_per_hour,
            "targets": {
                "latency_p95_s": self.targets.latency_p95_s,
                "throughput_tok_s": self.targets.throughput_tok_s,
            },
            "kinds": [
                {
                    "accelerator": k.accelerator,
                    "tensor_parallel": k.tp,
                    "worker_price": k.worker_price,
                }
                for k in self.kinds
            ],
            "frontier": [self.row(o) for o in self.frontier],
            "recommended": self.row(self.recommended) if self.recommended else None,
            "reason": self.reason,
            "reference": self.row(self.reference) if self.reference else None,
            "simulations": self.evaluated,
        }


def kinds_of(base: Scenario, offers: Sequence[Offer]) -> tuple[Kind, ...]:
    """Each offered type as a worker under the scenario's model and knobs. A type the
    scenario has keeps its group's affinity and figures; another is ranked among them by
    its bandwidth (the paper's affinity follows decode speed)."""
    if not offers:
        raise AdviceError("offer at least one accelerator type")
    own = {g.accelerator: g for g in base.groups}
    ranked = sorted({*own, *(o.accelerator for o in offers)}, key=_bandwidth)
    out = []
    for o in offers:
        if o.accelerator not in own and o.accelerator not in ACCELERATORS:
            known = ", ".join(sorted(ACCELERATORS))
            raise AdviceError(f"unknown accelerator {o.accelerator!r}: offer one of {known}")
        if o.price_per_hour <= 0 or o.devices < 1:
            raise AdviceError(f"{o.accelerator}: offer at least one device at a positive price")
        template = own.get(o.accelerator) or Group(
            name=o.accelerator.lower(),
            accelerator=o.accelerator,
            devices=1,
            affinity=ranked.index(o.accelerator),
        )
        template = template.model_copy(update={"price_per_hour": o.price_per_hour})
        tp = _degree(base, template)
        if tp is None or tp > o.devices:
            continue
        out.append(
            Kind(
                o.accelerator,
                tp,
                o.devices // tp,
                o.price_per_hour * tp,
                template.affinity,
                template,
            )
        )
    if not out:
        raise AdviceError(
            f"no offered type holds {base.model} with {base.min_kv_tokens():,} tokens of KV "
            "in the devices offered"
        )
    return tuple(out)


def _bandwidth(accelerator: str) -> float:
    known = ACCELERATORS.get(accelerator)
    return known.bandwidth.value if known is not None else 0.0


def _degree(base: Scenario, group: Group) -> int | None:
    """The tensor-parallel degree a worker of this group takes, or None if none holds
    the model and the knobs' KV."""
    if group.tensor_parallel is not None:
        return group.tensor_parallel
    probe = {**group.model_dump(exclude_unset=True), "name": "probe", "devices": 8}
    raw = base.model_dump(exclude_unset=True)
    raw.pop("autoscaling", None)  # a fixed probe: its cost is no budget's concern
    try:
        deployed = Scenario.model_validate({**raw, "groups": [probe]})
    except ValueError:
        return None
    return deployed.deployments()[0].deployment.tp


def scenario_of(base: Scenario, kinds: Sequence[Kind], mix: Mix, iterations: int) -> Scenario:
    """The base scenario on this mix, run for `iterations` batches, at a fixed size (an
    `autoscaling` section of the base is left out: the advisor compares fixed pools)."""
    groups = [
        k.template.model_dump(exclude_unset=True)
        | {"devices": n * k.tp, "price_per_hour": k.template.price_per_hour}
        for n, k in zip(mix, kinds, strict=True)
        if n
    ]
    raw = base.model_dump(exclude_unset=True)
    raw.pop("autoscaling", None)
    workload = {**raw.get("workload", {}), "iterations": iterations}
    return Scenario.model_validate({**raw, "groups": groups, "workload": workload})


def _run(scenario: Scenario, policy: str) -> tuple[float, float]:
    r = Simulation(scenario, make_policy(policy, {})).run()
    return r.throughput_tok_s, r.latency_p95_s


@dataclass
class Search:
    """One search's state: the runs so far, by (mix, iterations)."""

    base: Scenario
    kinds: tuple[Kind, ...]
    budget: float
    policy: str
    executor: Executor | None
    runs: dict[tuple[Mix, int], Outcome] = field(default_factory=dict)
    on_round: Callable[[str, int], None] | None = None

    def cost(self, mix: Mix) -> float:
        return sum(n * k.worker_price for n, k in zip(mix, self.kinds, strict=True))

    def fits(self, mix: Mix) -> bool:
        return (
            any(mix)
            and all(0 <= n <= k.max_workers for n, k in zip(mix, self.kinds, strict=True))
            and self.cost(mix) <= self.budget + 1e-9
        )

    def evaluate(self, mixes: Sequence[Mix], iterations: int, what: str) -> list[Outcome]:
        todo = [m for m in dict.fromkeys(mixes) if (m, iterations) not in self.runs]
        if self.on_round is not None and todo:
            self.on_round(what, len(todo))
        scenarios = [scenario_of(self.base, self.kinds, m, iterations) for m in todo]
        if self.executor is None:
            figures: Iterator[tuple[float, float]] = map(_run, scenarios, [self.policy] * len(todo))
        else:
            figures = self.executor.map(_run, scenarios, [self.policy] * len(todo))
        for m, (tok_s, p95) in zip(todo, figures, strict=True):
            self.runs[(m, iterations)] = Outcome(m, iterations, tok_s, p95, self.cost(m))
        return [self.runs[(m, iterations)] for m in dict.fromkeys(mixes)]


def pareto_ranks(outcomes: Sequence[Outcome]) -> dict[Mix, int]:
    """Non-dominated sorting: rank 0 is the Pareto set, rank 1 what it alone dominates."""
    left, rank, out = list(outcomes), 0, {}
    while left:
        front = [o for o in left if not any(p.dominates(o) for p in left)]
        for o in front:
            out[o.mix] = rank
        left = [o for o in left if o.mix not in out]
        rank += 1
    return out


def _best(outcomes: Sequence[Outcome], keep: int, targets: Targets) -> list[Outcome]:
    """The `keep` most promising: those meeting the targets first, then by Pareto rank,
    then the most tok/$. (Pareto rank alone would keep the cheapest pools, whose tok/$
    no larger pool beats, and lose every mix that meets a P95.)"""
    ranks = pareto_ranks(outcomes)
    order = sorted(outcomes, key=lambda o: (not targets.met(o), ranks[o.mix], -o.tokens_per_dollar))
    return order[:keep]


def _levels(most: int) -> tuple[int, list[int]]:
    step = max(1, math.ceil(most / (LEVELS - 1)))
    return step, sorted({*range(0, most + 1, step), most})


def search(
    base: Scenario,
    offers: Sequence[Offer],
    budget_per_hour: float,
    *,
    targets: Targets = Targets(),
    policy: str = "cadence",
    low_iterations: int = 2,
    jobs: int = 1,
    on_round: Callable[[str, int], None] | None = None,
) -> Advice:
    """Search the mixes of `offers` within `budget_per_hour` (see the module's docstring)."""
    if not math.isfinite(budget_per_hour) or budget_per_hour <= 0:
        raise AdviceError("the budget must be a positive price per hour")
    kinds = kinds_of(base, offers)
    cheapest = min(k.worker_price for k in kinds)
    if cheapest > budget_per_hour:
        raise AdviceError(
            f"the budget of {budget_per_hour:g}/h buys no worker: the cheapest costs {cheapest:g}/h"
        )
    full = base.workload.iterations
    low = min(low_iterations, full)
    with _executor(jobs) as executor:
        s = Search(base, kinds, budget_per_hour, policy, executor, on_round=on_round)
        grids = [_levels(k.max_workers) for k in kinds]
        steps = [g[0] for g in grids]
        candidates = [m for m in product(*(g[1] for g in grids)) if s.fits(m)]
        if not candidates:
            raise AdviceError("no mix of the offered devices fits the budget")
        keep = max(MIN_KEEP, math.ceil(len(candidates) * KEEP))
        reference_mix = _reference_mix(base, kinds)
        if reference_mix is not None and not s.fits(reference_mix):
            reference_mix = None  # the pool as it is costs more than the budget
        steer = targets
        if reference_mix is not None and targets.latency_p95_s is None:
            # Where no P95 is asked for, the pool as it is sets it: as it runs at low
            # fidelity while the search does, and at full fidelity for the answer.
            (now,) = s.evaluate([reference_mix], low, "the pool as it is")
            steer = Targets(now.latency_p95_s, targets.throughput_tok_s)
        alive = _best(s.evaluate(candidates, low, "coarse grid"), keep, steer)
        while max(steps) > 1:
            steps = [max(1, st // 2) for st in steps]
            around = [
                tuple(n + d * st for n, d, st in zip(o.mix, delta, steps, strict=True))
                for o in alive
                for delta in product((-1, 0, 1), repeat=len(kinds))
            ]
            near = [m for m in around if s.fits(m)]
            alive = _best(s.evaluate(near, low, f"refining, step {max(steps)}"), keep, steer)
        finalists = [o.mix for o in _best(alive, FINAL, steer)]
        if reference_mix is not None:
            finalists.append(reference_mix)
        finals = s.evaluate(finalists, full, "full runs")
    reference = s.runs.get((reference_mix, full)) if reference_mix is not None else None
    ranks = pareto_ranks(finals)
    frontier = sorted((o for o in finals if ranks[o.mix] == 0), key=lambda o: -o.tokens_per_dollar)
    chosen, reason = _recommend(finals, reference, targets, kinds)
    return Advice(
        kinds,
        budget_per_hour,
        frontier,
        chosen,
        reason,
        reference,
        len(s.runs),
        full,
        targets,
        finals,
    )


def _reference_mix(base: Scenario, kinds: Sequence[Kind]) -> Mix | None:
    """The scenario's own pool as a mix of the offered kinds, if the offer holds it."""
    by_type = {k.accelerator: i for i, k in enumerate(kinds)}
    mix = [0] * len(kinds)
    for g, d in zip(base.groups, base.deployments(), strict=True):
        i = by_type.get(g.accelerator)
        if i is None or d.deployment.tp != kinds[i].tp:
            return None
        mix[i] += d.workers
    out = tuple(mix)
    if any(n > k.max_workers for n, k in zip(out, kinds, strict=True)):
        return None
    return out


def _recommend(
    finals: Sequence[Outcome], reference: Outcome | None, targets: Targets, kinds: Sequence[Kind]
) -> tuple[Outcome | None, str]:
    """The most tok/$ that meets the targets; the reference pool's P95 is the target
    where none is given."""
    p95 = targets.latency_p95_s
    if p95 is None and reference is not None:
        p95 = reference.latency_p95_s
    wanted = Targets(p95, targets.throughput_tok_s)
    meeting = [o for o in finals if wanted.met(o)]
    if not meeting:
        return None, "no mix searched meets the targets; the frontier shows the nearest"
    best = max(meeting, key=lambda o: o.tokens_per_dollar)
    said = [f"the most tok/$ ({best.tokens_per_dollar:,.0f}) of the mixes"]
    if p95 is not None:
        said.append(f"with a P95 within {p95:.1f} s")
    if targets.throughput_tok_s is not None:
        said.append(f"and at least {targets.throughput_tok_s:,.0f} tok/s")
    if reference is not None:
        said.append(
            f"({best.tokens_per_dollar / reference.tokens_per_dollar:.2f}x the current pool's "
            f"tok/$, {best.throughput_tok_s / reference.throughput_tok_s:.2f}x its tok/s, "
            f"P95 {best.latency_p95_s:.1f} s against {reference.latency_p95_s:.1f} s)"
        )
        if best.mix == reference.mix:
            said = [
                "the current pool is on the frontier: no mix searched beats its tok/$ "
                f"at its P95 of {reference.latency_p95_s:.1f} s"
            ]
    return best, " ".join(said)


@dataclass(frozen=True, slots=True)
class Marginal:
    accelerator: str
    added_per_hour: float
    throughput_tok_s: float  # with one more worker of this type
    latency_p95_s: float
    tokens_per_dollar: float

    def row(self, before: Outcome) -> dict[str, Any]:
        return {
            "accelerator": self.accelerator,
            "added_per_hour": round(self.added_per_hour, 2),
            "throughput_tok_s": round(self.throughput_tok_s, 1),
            "throughput_gain": round(self.throughput_tok_s / before.throughput_tok_s - 1, 4),
            "latency_p95_s": round(self.latency_p95_s, 2),
            "latency_p95_change": round(self.latency_p95_s / before.latency_p95_s - 1, 4),
            "tokens_per_dollar": round(self.tokens_per_dollar),
            "tok_s_per_dollar_hour": round(
                (self.throughput_tok_s - before.throughput_tok_s) / self.added_per_hour, 1
            ),
        }


def marginal(
    base: Scenario, offers: Sequence[Offer], *, policy: str = "cadence", jobs: int = 1
) -> tuple[Outcome, list[Marginal]]:
    """The pool as it is, and with one more worker of each offered type."""
    kinds = kinds_of(base, offers)
    now = _reference_mix(base, kinds)
    if now is None:
        raise AdviceError(
            "offer every type of the current pool, at the pool's tensor-parallel degree"
        )
    unbounded = [
        Kind(k.accelerator, k.tp, max(k.max_workers, n + 1), k.worker_price, k.affinity, k.template)
        for k, n in zip(kinds, now, strict=True)
    ]
    mixes = [now, *(tuple(n + (j == i) for j, n in enumerate(now)) for i in range(len(kinds)))]
    with _executor(jobs) as executor:
        s = Search(base, tuple(unbounded), math.inf, policy, executor)
        outcomes = s.evaluate(mixes, base.workload.iterations, "one more worker of each type")
    before, after = outcomes[0], outcomes[1:]
    return before, [
        Marginal(
            k.accelerator, k.worker_price, o.throughput_tok_s, o.latency_p95_s, o.tokens_per_dollar
        )
        for k, o in zip(kinds, after, strict=True)
    ]


class _executor:
    """A process pool for `jobs` > 1 (spawned: the caller may hold threads), else none."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Executor | None:
        if self.jobs > 1:
            context = multiprocessing.get_context("spawn")
            self.pool = ProcessPoolExecutor(self.jobs, mp_context=context)
        return self.pool

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def offers_of(
    base: Scenario, available: Mapping[str, int], prices: Mapping[str, float]
) -> list[Offer]:
    """Offers from counts of devices and prices, a type's price defaulting to the
    scenario's group or the catalog."""
    own = {g.accelerator: g for g in base.groups}
    out = []
    for acc, devices in available.items():
        price = prices.get(acc)
        if price is None and acc in own and own[acc].price_per_hour is not None:
            price = own[acc].price_per_hour
        if price is None:
            known = ACCELERATORS.get(acc)
            if known is not None and known.price_per_hour is not None:
                price = known.price_per_hour.value
        if price is None:
            raise AdviceError(f"no price for {acc}: give --price {acc}=PRICE_PER_DEVICE_HOUR")
        out.append(Offer(acc, devices, price))
    return out
