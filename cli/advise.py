"""`cadence advise`: which pool mix to rent for a workload and a budget (`sim/advise.py`),
or what one more worker of each type buys on the pool as it is (`--marginal`).

The workload is a scenario file, the resources `cadence run` takes, or a run's trace (its
replay, `sim/replay.py`). What may be rented is `--available TYPE=DEVICES` at
`--price TYPE=PER_DEVICE_HOUR` (the scenario's or the catalog's price where not given).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from cadence.cli.common import Commands, UsageError, output_file, positive_number
from cadence.cli.sim import load_scenario, replayed
from cadence.common.limits import MAX_ETA
from cadence.common.pool import MAX_PRICE_PER_HOUR
from cadence.scheduler.registry import POLICIES
from cadence.sim.advise import (
    Advice,
    AdviceError,
    Offer,
    Outcome,
    Targets,
    marginal,
    offers_of,
    search,
)
from cadence.sim.laws import MAX_DEVICES
from cadence.sim.scenario import Scenario


def _pairs(
    items: Sequence[str], flag: str, kind: type[int] | type[float], most: float
) -> dict[str, float]:
    """`TYPE=N` items, each a comma-separated list or one pair, as a mapping; each N
    positive, finite and at most `most`."""
    out: dict[str, float] = {}
    for item in items:
        for pair in item.split(","):
            name, eq, value = pair.strip().partition("=")
            try:
                number = kind(value)
            except ValueError:
                number = None
            if not (eq and name) or number is None:
                raise UsageError(f"{flag} {pair.strip()!r} is not TYPE=NUMBER (e.g. H800=16)")
            if not (math.isfinite(number) and 0 < number <= most):
                raise UsageError(
                    f"{flag} {pair.strip()!r}: {name}'s number must be above 0 and at most {most:g}"
                )
            out[name] = number
    return out


def _workload(args: argparse.Namespace) -> Scenario:
    if (args.scenario is None) == (args.trace is None):
        raise UsageError("give either --scenario FILE or --trace FILE")
    if args.trace is not None:
        return load_scenario(args.trace, args.set or (), scenario=replayed(args.trace)[0])
    return load_scenario(args.scenario, args.set or ())


def _pool_cost(scenario: Scenario) -> float | None:
    total = 0.0
    for d in scenario.deployments():
        price = d.deployment.accelerator.price_per_hour
        if price is None:
            return None
        total += price.value * d.deployment.tp * d.workers
    return total


def _table(found: Advice, rows: Sequence[Outcome], title: str) -> Table:
    t = Table(title=title)
    for col in ("mix", "tok/s", "P95 s", "tok/$", "$/h"):
        t.add_column(col, justify="left" if col == "mix" else "right")
    for o in rows:
        mark = " (current)" if found.reference is not None and o.mix == found.reference.mix else ""
        t.add_row(
            found.describe(o.mix) + mark,
            f"{o.throughput_tok_s:,.0f}",
            f"{o.latency_p95_s:,.1f}",
            f"{o.tokens_per_dollar:,.0f}",
            f"{o.cost_per_hour:,.2f}",
        )
    return t


def _cmd_advise(args: argparse.Namespace) -> int:
    scenario = _workload(args)
    if args.eta is not None:
        if not 0 <= args.eta <= MAX_ETA:
            raise UsageError(f"--eta is {args.eta}; it must be from 0 to {MAX_ETA}")
        scheduling = scenario.scheduling.model_copy(update={"eta": args.eta})
        scenario = scenario.model_copy(update={"scheduling": scheduling})
    if args.policy not in POLICIES:
        raise UsageError(f"unknown policy {args.policy}; available: {', '.join(POLICIES)}")
    if args.jobs < 1:
        raise UsageError(f"--jobs is {args.jobs}; it must be at least 1")
    available = _pairs(args.available or [], "--available", int, MAX_DEVICES)
    if not available:  # the scenario's own types, at twice their devices
        available = {}
        for g in scenario.groups:
            available[g.accelerator] = available.get(g.accelerator, 0) + 2 * g.devices
    prices = _pairs(args.price or [], "--price", float, MAX_PRICE_PER_HOUR)
    out = Console(width=None if sys.stdout.isatty() else 120)
    try:
        offers = offers_of(scenario, {k: int(v) for k, v in available.items()}, prices)
        if args.marginal:
            return _marginal(scenario, offers, args, out)
        budget = args.budget if args.budget is not None else _pool_cost(scenario)
        if budget is None:
            raise UsageError("the pool has a type with no price: give --budget")
        started = time.perf_counter()

        def said(what: str, n: int) -> None:
            print(f"{time.perf_counter() - started:6.0f} s  {what}: {n} mixes", file=sys.stderr)

        found = search(
            scenario,
            offers,
            budget,
            targets=Targets(args.p95, args.throughput),
            policy=args.policy,
            jobs=args.jobs,
            on_round=said,
        )
    except AdviceError as e:
        raise UsageError(str(e)) from None
    seconds = time.perf_counter() - started
    out.print(_table(found, found.frontier, f"Pareto set within {budget:g}/h ({args.policy})"))
    if found.reference is not None:
        print(f"current pool: {found.describe(found.reference.mix)}")
    if found.recommended is not None:
        print(f"recommended: {found.describe(found.recommended.mix)}")
    print(f"why: {found.reason}")
    print(f"{found.evaluated} simulations in {seconds:.0f} s")
    doc = {"scenario": scenario.name, "policy": args.policy, "seconds": round(seconds, 1)}
    doc |= found.to_json()
    if args.plot is not None:
        from cadence.sim import plots  # noqa: PLC0415 (matplotlib: half a second)

        print(f"wrote {plots.advice(found, args.plot)}")
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


def _marginal(
    scenario: Scenario, offers: list[Offer], args: argparse.Namespace, out: Console
) -> int:
    before, each = marginal(scenario, offers, policy=args.policy, jobs=args.jobs)
    t = Table(title=f"One more worker on {scenario.name} ({args.policy})")
    for col in ("type", "+$/h", "tok/s", "P95 s", "tok/$", "+tok/s per $/h"):
        t.add_column(col, justify="left" if col == "type" else "right")
    t.add_row(
        "(as it is)",
        "",
        f"{before.throughput_tok_s:,.0f}",
        f"{before.latency_p95_s:,.1f}",
        f"{before.tokens_per_dollar:,.0f}",
        "",
    )
    rows = [m.row(before) for m in each]
    for m, r in zip(each, rows, strict=True):
        t.add_row(
            m.accelerator,
            f"{m.added_per_hour:,.2f}",
            f"{m.throughput_tok_s:,.0f} ({r['throughput_gain']:+.1%})",
            f"{m.latency_p95_s:,.1f} ({r['latency_p95_change']:+.1%})",
            f"{m.tokens_per_dollar:,.0f}",
            f"{r['tok_s_per_dollar_hour']:,.0f}",
        )
    out.print(t)
    best = max(each, key=lambda m: m.throughput_tok_s - before.throughput_tok_s)
    print(f"most throughput per worker: one more {best.accelerator}")
    if args.json is not None:
        doc = {
            "scenario": scenario.name,
            "policy": args.policy,
            "now": {
                "throughput_tok_s": round(before.throughput_tok_s, 1),
                "latency_p95_s": round(before.latency_p95_s, 2),
                "tokens_per_dollar": round(before.tokens_per_dollar),
            },
            "one_more": rows,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


def add_advise(sub: Commands) -> None:
    """`cadence advise`."""
    a = sub.add_parser(
        "advise",
        help="search pool mixes within a budget with the simulator, or what one more "
        "worker of each type buys",
        description="Search the mixes of the accelerators available within a budget, "
        "running the real policy in the simulator (successive halving over a "
        "coarse-to-fine grid), and print the Pareto set over tok/s, P95 and tok/$ with a "
        "recommended mix and why.",
    )
    a.add_argument("--scenario", type=Path, help="scenario YAML, or the file cadence run takes")
    a.add_argument("--trace", type=Path, help="a run's trace (trace.jsonl), replayed")
    a.add_argument(
        "--set", action="append", metavar="PATH=VALUE", help="set a scenario field; repeatable"
    )
    a.add_argument(
        "--budget",
        type=positive_number,
        help="price per hour to spend at most (default: the pool's own)",
    )
    a.add_argument(
        "--available",
        action="append",
        metavar="TYPE=DEVICES",
        help="devices of a type that may be rented, e.g. H800=16,A910X=32 (default: the "
        "scenario's types at twice their devices)",
    )
    a.add_argument(
        "--price",
        action="append",
        metavar="TYPE=PRICE",
        help="a type's price per device-hour (default: the scenario's, else the catalog's)",
    )
    a.add_argument("--eta", type=int, help="the staleness bound (default: the scenario's)")
    a.add_argument(
        "--p95", type=positive_number, metavar="SECONDS", help="a P95 latency to stay within"
    )
    a.add_argument(
        "--throughput", type=positive_number, metavar="TOK_S", help="tok/s to reach at least"
    )
    a.add_argument("--policy", default="cadence", help="the policy the pool runs")
    a.add_argument(
        "--marginal",
        action="store_true",
        help="instead: what one more worker of each available type buys on the pool as it is",
    )
    a.add_argument("--plot", type=output_file, metavar="PNG", help="draw the frontier here")
    a.add_argument("--json", type=output_file, help="write the answer as JSON here")
    a.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="simulations at once, each in its own process (default: one per core)",
    )
    a.set_defaults(run=_cmd_advise)
