"""PNG plots of simulated runs: the throughput arc, mean context per accelerator type (the
paper's Figure 13), one long trajectory's life (Figure 14) and knob sweeps (Figures 15 and
16), one line or panel per policy; and the pool advisor's frontier (`cadence advise`)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from cadence.common.captions import captioned
from cadence.sim.advise import Advice
from cadence.sim.records import Result

THROUGHPUT_CAPTION = (
    "Decode throughput over simulated time, one line per policy: the arc falls when a "
    "version's short work runs out and its long tail remains; a policy that keeps it high "
    "keeps its accelerators busy through the tail."
)
CONTEXT_CAPTION = (
    "Mean context of the resident trajectories per accelerator type: concentration shows "
    "as the highest-affinity type's line rising while the long tail runs there."
)
TRAJECTORY_CAPTION = (
    "One long trajectory under each policy: its share of its worker's KV while resident "
    "(gaps: waiting to be placed) and its tokens generated; a steeper lower line is a "
    "trajectory that finished sooner."
)
SWEEP_CAPTION = (
    "Throughput (left) and P95 latency (right) at each value of the setting: a value "
    "worth choosing raises the left without raising the right."
)
FRONTIER_CAPTION = (
    "Throughput against P95 latency, one point per value of the setting (labelled on "
    "Cadence's line), faint points for every setting a baseline's sweep tried: "
    "lower right is better, and a point up and to the left of another loses to it on both."
)


def _smoothed(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def throughput_arc(results: list[Result], path: Path, window_s: float = 30.0) -> Path:
    """Decode throughput over time, smoothed over `window_s`, one line per policy."""
    fig, ax = plt.subplots(figsize=(9, 4))
    for r in results:
        if not r.timeline:
            continue
        period = r.timeline[1].time - r.timeline[0].time if len(r.timeline) > 1 else 1.0
        window = max(1, round(window_s / period))
        rate = [s.tokens / period for s in r.timeline]
        ax.plot([s.time for s in r.timeline], _smoothed(rate, window), label=r.policy)
    ax.set_xlabel("simulated seconds")
    ax.set_ylabel(f"decode tokens/s ({window_s:.0f} s mean)")
    ax.set_title("Throughput arc")
    ax.legend()
    captioned(fig, THROUGHPUT_CAPTION)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def context_by_accelerator(result: Result, path: Path, window_s: float = 30.0) -> Path:
    """Mean resident context per accelerator type over time (the paper's Figure 13)."""
    fig, ax = plt.subplots(figsize=(9, 4))
    types = sorted({a for s in result.timeline for a in s.mean_context})
    period = result.timeline[1].time - result.timeline[0].time if len(result.timeline) > 1 else 1.0
    window = max(1, round(window_s / period))
    for a in types:
        points = [(s.time, s.mean_context[a]) for s in result.timeline if a in s.mean_context]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, _smoothed(list(ys), window), label=a)
    ax.set_xlabel("simulated seconds")
    ax.set_ylabel("mean resident context (tokens)")
    ax.set_title(f"Mean context per accelerator type: {result.policy}")
    ax.legend()
    captioned(fig, CONTEXT_CAPTION)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def long_trajectory(results: list[Result], path: Path) -> Path:
    """One long trajectory followed under each policy that traced it (the paper's Figure
    14): its share of its worker's resident KV while resident (gaps while it waits in
    pending), and its generated tokens, against time since its first step."""
    fig, (share, progress) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for r in results:
        if not r.trace:
            continue
        start = r.trace[0].time
        xs = [p.time - start for p in r.trace]
        life = r.trace[:-1] or r.trace  # the last point is its completion
        resident = sum(p.resident for p in life) / len(life)
        label = f"{r.policy} (resident {resident:.0%})"
        share.plot(xs, [p.kv_share if p.resident else math.nan for p in r.trace], label=label)
        progress.plot(xs, [p.generated for p in r.trace], label=r.policy)
    share.set_ylabel("share of its worker's KV")
    share.set_title("One long trajectory over its life")
    share.legend()
    progress.set_xlabel("seconds since its first step")
    progress.set_ylabel("tokens generated")
    captioned(fig, TRAJECTORY_CAPTION)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def frontier(path_name: str, by_value: dict[object, list[Result]], path: Path) -> Path:
    """Each policy's (throughput, P95) at each value of one setting: the trade the
    setting moves along, beside the baselines' points."""
    values = list(by_value)
    policies = [r.policy for r in by_value[values[0]]]
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, name in enumerate(policies):
        runs = [by_value[v][i] for v in values]
        xs = [r.throughput_tok_s for r in runs]
        ys = [r.latency_p95_s for r in runs]
        (line,) = ax.plot(xs, ys, marker="o", label=name, linewidth=2 if i == 0 else 1)
        if name == "cadence":
            for v, x, y in zip(values, xs, ys, strict=True):
                ax.annotate(str(v), (x, y), textcoords="offset points", xytext=(4, 4))
        tried = [t for r in runs for t in r.extras.get("sweep", ())]
        if tried:
            ax.scatter(
                [t["throughput_tok_s"] for t in tried],
                [t["latency_p95_s"] for t in tried],
                color=line.get_color(),
                alpha=0.3,
                s=12,
            )
    ax.set_xlabel("decode tokens/s")
    ax.set_ylabel("P95 latency (s)")
    ax.set_title(f"Throughput and P95 latency along {path_name}")
    ax.legend()
    captioned(fig, FRONTIER_CAPTION)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


ADVICE_CAPTION = (
    "Pool mixes run at full fidelity: throughput against P95 latency, coloured by tokens "
    "per dollar. Ringed points are the Pareto set over the three; the square is the "
    "scenario's own pool, the star the recommended mix. Lower right is better."
)


def advice(found: Advice, path: Path) -> Path:
    """The advisor's full runs, its Pareto set, the current pool and its pick."""
    fig, ax = plt.subplots(figsize=(8, 5.5))
    runs = found.finals
    dots = ax.scatter(
        [o.throughput_tok_s for o in runs],
        [o.latency_p95_s for o in runs],
        c=[o.tokens_per_dollar for o in runs],
        cmap="viridis",
        s=40,
        zorder=2,
    )
    fig.colorbar(dots, ax=ax, label="tokens per dollar")
    ax.scatter(
        [o.throughput_tok_s for o in found.frontier],
        [o.latency_p95_s for o in found.frontier],
        facecolors="none",
        edgecolors="black",
        s=140,
        label="Pareto set",
        zorder=3,
    )
    for o in found.frontier:
        ax.annotate(
            found.describe(o.mix),
            (o.throughput_tok_s, o.latency_p95_s),
            textcoords="offset points",
            xytext=(-8, 6),
            ha="right",
            fontsize=7,
        )
    marked = (
        (found.reference, "s", "red", 80, "current pool"),
        (found.recommended, "*", "orange", 260, "recommended"),
    )
    for z, (point, marker, colour, size, label) in enumerate(marked, start=4):
        if point is not None:
            ax.scatter(
                [point.throughput_tok_s],
                [point.latency_p95_s],
                marker=marker,
                color=colour,
                s=size,
                label=label,
                zorder=z,
            )
    ax.set_xlabel("decode tokens/s")
    ax.set_ylabel("P95 latency (s)")
    ax.set_title(f"Pool mixes within {found.budget_per_hour:g} per hour")
    ax.legend(loc="upper left", fontsize=8)
    captioned(fig, ADVICE_CAPTION)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(results: list[Result], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [throughput_arc(results, directory / "throughput_arc.png")]
    for r in results:
        paths.append(context_by_accelerator(r, directory / f"context_by_type_{r.policy}.png"))
    if any(r.trace for r in results):
        paths.append(long_trajectory(results, directory / "long_trajectory.png"))
    return paths


def knob_sweep(path_name: str, by_value: dict[object, list[Result]], path: Path) -> Path:
    """Throughput and P95 latency against one scenario setting (Figures 15 and 16)."""
    values = list(by_value)
    policies = [r.policy for r in by_value[values[0]]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for i, name in enumerate(policies):
        xs = [str(v) for v in values]
        left.plot(xs, [by_value[v][i].throughput_tok_s for v in values], marker="o", label=name)
        right.plot(xs, [by_value[v][i].latency_p95_s for v in values], marker="o", label=name)
    left.set_xlabel(path_name)
    left.set_ylabel("decode tokens/s")
    right.set_xlabel(path_name)
    right.set_ylabel("P95 latency (s)")
    left.legend()
    fig.suptitle(f"Sweep of {path_name}")
    captioned(fig, SWEEP_CAPTION)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
