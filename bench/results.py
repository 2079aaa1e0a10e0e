"""The results page's tables from `cadence sim --json` documents, so every figure on
docs/results.md comes from a file a command wrote and can be made again:

    for s in 16A16B8H ...; do
      cadence sim --scenario sim/scenarios/seed-$s.yaml --frontier --json DIR/$s.json
      cadence sim --scenario sim/scenarios/seed-$s.yaml --policies cadence,laminar-native \
          --set scheduling.eta=4 --sweep --json DIR/$s-native.json
    done
    python -m cadence.bench.results DIR

prints the summary at equal staleness (every policy held to the scenario's eta), the
frontier (is Cadence dominated, and what it trades against the fastest run within its
bound; then the figures the frontier targets are judged on, as one JSON line), the native
rows (Laminar as its paper ran it, beside Cadence at the same bound), and one table per
scenario, as Markdown.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from cadence.sim.frontier import frontier

BASELINES = ("sync", "one-off", "areal", "laminar", "dora")
ORDER = (
    "seed-homo-qwen3-8b",
    "seed-homo-qwen3-14b",
    "seed-homo-qwen3-32b",
    "seed-32A",
    "seed-32B",
    "seed-16A16B",
    "seed-16A8H",
    "seed-16B8H",
    "seed-16A16B8H",
)


def _pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.0f}%"


def _setting(entry: dict[str, Any]) -> str:
    names = {
        "max_concurrent": "cap",
        "prompts_per_take": "take",
        "decode_batch_bound": "B",
        "rebalance_period_s": "every",
    }
    s = entry.get("settings") or {}
    return ", ".join(f"{names.get(k, k)} {'none' if v is None else v}" for k, v in s.items())


def summary(docs: dict[str, dict[str, Any]]) -> list[str]:
    out = [
        "| scenario | Cadence tok/s | vs Laminar | vs AReaL | best baseline tok/s | "
        "Cadence P95 s | Laminar P95 | AReaL P95 | lowest baseline P95 | "
        "Cadence tok/$ rank | bound (lag) |",
        "|---|--:|--:|--:|---|--:|--:|--:|---|--:|---|",
    ]
    for name, doc in docs.items():
        p = doc["policies"]
        c, lam, ar = p["cadence"], p["laminar"], p["areal"]
        best = max(BASELINES, key=lambda b: p[b]["throughput_tok_s"])
        low = min(BASELINES, key=lambda b: p[b]["latency_p95_s"])
        rank = 1 + sum(
            (p[b]["tokens_per_dollar"] or 0) > (c["tokens_per_dollar"] or 0) for b in BASELINES
        )
        lags = ", ".join(f"{k} {v['max_version_lag']}" for k, v in p.items())
        out.append(
            f"| {name} | {c['throughput_tok_s']:,.0f} | "
            f"{_pct(c['throughput_tok_s'], lam['throughput_tok_s'])} | "
            f"{_pct(c['throughput_tok_s'], ar['throughput_tok_s'])} | "
            f"{best} {p[best]['throughput_tok_s']:,.0f} | {c['latency_p95_s']:,.0f} | "
            f"{lam['latency_p95_s']:,.0f} | {ar['latency_p95_s']:,.0f} | "
            f"{low} {p[low]['latency_p95_s']:,.0f} | {rank} | "
            f"{c['staleness_bound']} ({lags}) |"
        )
    return out


def native(docs: dict[str, dict[str, Any]]) -> list[str]:
    out = [
        "| scenario | Cadence tok/s | laminar-native tok/s | Cadence vs native | "
        "Cadence P95 s | laminar-native P95 s | lag used (Cadence, native) |",
        "|---|--:|--:|--:|--:|--:|---|",
    ]
    for name, doc in docs.items():
        c, n = doc["policies"]["cadence"], doc["policies"]["laminar-native"]
        out.append(
            f"| {name} | {c['throughput_tok_s']:,.0f} | {n['throughput_tok_s']:,.0f} | "
            f"{_pct(c['throughput_tok_s'], n['throughput_tok_s'])} | "
            f"{c['latency_p95_s']:,.0f} | {n['latency_p95_s']:,.0f} | "
            f"{c['max_version_lag']}, {n['max_version_lag']} |"
        )
    return out


def frontier_table(docs: dict[str, dict[str, Any]]) -> list[str]:
    """Per pool: is Cadence dominated (another run, at any setting its sweep tried and
    within Cadence's staleness bound, with more throughput and a P95 no higher), and
    against the fastest such run, how much throughput it gives up for how much P95."""
    out = [
        "| scenario | eta | Cadence tok/s | Cadence P95 s | fastest within the bound | "
        "its tok/s | its P95 s | Cadence tok/s vs it | Cadence P95 vs it | dominated by |",
        "|---|--:|--:|--:|---|--:|--:|--:|--:|---|",
    ]
    for name, doc in docs.items():
        f = frontier(doc["policies"])
        ref, top = f.reference, f.fastest
        fastest = "Cadence" if top is ref else top.label()
        dominated = ", ".join(p.label() for p in f.dominated_by) or "none"
        out.append(
            f"| {name} | {f.bound} | {ref.throughput_tok_s:,.0f} | {ref.latency_p95_s:,.0f} | "
            f"{fastest} | {top.throughput_tok_s:,.0f} | {top.latency_p95_s:,.0f} | "
            f"{(f.throughput_ratio - 1) * 100:+.1f}% | {(f.p95_ratio - 1) * 100:+.1f}% | "
            f"{dominated} |"
        )
    return out


def frontier_summary(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The figures the frontier targets are judged on, over every pool."""
    verdicts = {name: frontier(doc["policies"]) for name, doc in docs.items()}
    trailing = {n: f for n, f in verdicts.items() if f.fastest is not f.reference}
    return {
        "pools": len(verdicts),
        "dominated": sorted(n for n, f in verdicts.items() if f.dominated),
        "trailing": {
            n: {
                "throughput_ratio": round(f.throughput_ratio, 4),
                "p95_ratio": round(f.p95_ratio, 4),
            }
            for n, f in sorted(trailing.items())
        },
        # A trade a user would choose: at most 3% less throughput for a P95 20% lower.
        "trades_outside_target": sorted(
            n for n, f in trailing.items() if f.throughput_ratio < 0.97 or f.p95_ratio > 0.8
        ),
    }


def scenario_table(doc: dict[str, Any]) -> list[str]:
    out = [
        "| policy | best setting | tok/s | P50 s | P95 s | tok/$ | moves | tool | preempt | "
        "bound/lag | slowest 10% | tail waiting | sim s |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, e in doc["policies"].items():
        dollars = e["tokens_per_dollar"]
        out.append(
            f"| {name} | {_setting(e)} | {e['throughput_tok_s']:,.0f} | "
            f"{e['latency_p50_s']:,.0f} | {e['latency_p95_s']:,.0f} | "
            f"{'n/a' if dollars is None else f'{dollars:,.0f}'} | {e['migrations']:,} | "
            f"{e['tool_departures']:,} | {e['preemptions']:,} | "
            f"{e['staleness_bound']}/{e['max_version_lag']} | "
            f"{e['slowest_tenth_time_share']:.2f} | {e['tail_waiting_share']:.2f} | "
            f"{e['simulated_seconds']:,.0f} |"
        )
    return out


def main(directory: Path) -> str:
    found = {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}
    docs = {d["scenario"]: d for k, d in found.items() if not k.endswith("-native")}
    natives = {d["scenario"]: d for k, d in found.items() if k.endswith("-native")}
    rank = {n: i for i, n in enumerate(ORDER)}
    docs = dict(sorted(docs.items(), key=lambda kv: rank.get(kv[0], len(ORDER))))
    natives = dict(sorted(natives.items(), key=lambda kv: rank.get(kv[0], len(ORDER))))
    lines = ["## Summary at equal staleness", "", *summary(docs), ""]
    lines += ["## The frontier at equal staleness", "", *frontier_table(docs), ""]
    if natives:
        lines += ["## Laminar as its paper ran it, beside Cadence at the same bound", ""]
        lines += [*native(natives), ""]
    for name, doc in docs.items():
        lines += [f"### {name}", "", *scenario_table(doc), ""]
    lines += ["```json", json.dumps(frontier_summary(docs)), "```", ""]
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/results"))
