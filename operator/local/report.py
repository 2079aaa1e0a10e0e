"""What `cadence run` leaves in its folder: `run.json` (the measures, one entry per policy
when several ran), a terminal table, and `report.html` with PNG plots: throughput over
time, mean resident context per accelerator type, the latency CDF and reward per version
(with `--compare`, one line per policy in each), then for each policy the scheduler at
work (`mechanism_plots`): per-worker context, batch and role, one long trajectory's
moves, and the evictions, moves and advances on a timeline.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from rich import box
from rich.table import Table

from cadence.common.captions import captioned
from cadence.operator.local import mechanism_plots
from cadence.operator.local.run import RunResult

ROWS = (
    ("workers", "workers", "{}"),
    ("wall_seconds", "wall s", "{:,.1f}"),
    ("throughput_tok_s", "tok/s", "{:,.0f}"),
    ("latency_p50_s", "P50 s", "{:,.3f}"),
    ("latency_p95_s", "P95 s", "{:,.3f}"),
    ("tokens_per_dollar", "tok/$", "{:,.0f}"),
    ("samples_admitted", "admitted", "{:,}"),
    ("samples_delivered", "delivered", "{:,}"),
    ("samples_lost", "lost", "{:,}"),
    ("samples_duplicated", "accepted twice", "{:,}"),
    ("requeued", "re-queued", "{:,}"),
    ("hosts_killed", "worker processes struck", "{:,}"),
    ("trainer_restarts", "trainer restarts", "{:,}"),
    ("cycle_ms_p50", "cycle P50 ms", "{:,.1f}"),
    ("cycle_ms_p95", "cycle P95 ms", "{:,.1f}"),
)


def table(results: list[RunResult]) -> Table:
    """The measures side by side, a column per policy."""
    out = Table(box=box.SIMPLE_HEAD)
    out.add_column("")
    for r in results:
        out.add_column(str(r.measures["policy"]), justify="right")
    for key, label, fmt in ROWS:
        cells = []
        for r in results:
            value = r.measures.get(key)
            cells.append("-" if value is None else fmt.format(value))
        out.add_row(label, *cells)
    for label, cell in MECHANISM_ROWS:
        out.add_row(label, *(cell(r.measures) for r in results))
    last = [_reward_line(r) for r in results]
    out.add_row("reward first -> last", *last)
    return out


def _evictions(m: dict[str, object]) -> str:
    by_reason = m.get("evictions_by_reason")
    if not isinstance(by_reason, dict):
        return "-"
    return ", ".join(f"{n:,} {reason}" for reason, n in sorted(by_reason.items())) or "0"


def _moves(m: dict[str, object]) -> str:
    return f"{m.get('migrations_kv', 0):,} / {m.get('migrations_reprefill', 0):,}"


def _tail(m: dict[str, object]) -> str:
    share, kv = m.get("tail_top_affinity_share"), m.get("top_affinity_kv_share")
    if not isinstance(kv, float):
        return "-"
    return f"{'-' if share is None else f'{share:.0%}'} ({kv:.0%} of KV)"


def _staleness(m: dict[str, object]) -> str:
    return f"{m.get('staleness_bound', '-')} / {m.get('max_version_lag', '-')}"


# What the scheduler did, a cell per policy.
MECHANISM_ROWS = (
    ("evictions", _evictions),
    ("moves KV pull / re-prefill", _moves),
    ("tail on top affinity", _tail),
    ("staleness bound / max lag", _staleness),
)


def _reward_line(r: RunResult) -> str:
    rewards = _rewards(r)
    if not rewards:
        return "-"
    return f"{rewards[0][1]:.2f} (v{rewards[0][0]}) -> {rewards[-1][1]:.2f} (v{rewards[-1][0]})"


def _rewards(r: RunResult) -> list[tuple[int, float]]:
    rewards = r.measures.get("reward_by_version")
    if not isinstance(rewards, dict):
        return []
    return sorted((int(v), float(x)) for v, x in rewards.items())


def write(folder: Path, results: list[RunResult]) -> Path:
    """run.json, the four PNGs and report.html in `folder`; returns the page's path."""
    folder.mkdir(parents=True, exist_ok=True)
    measures = [r.measures for r in results]
    document = measures[0] if len(measures) == 1 else {"runs": measures}
    (folder / "run.json").write_text(json.dumps(document, indent=2) + "\n")
    plots = {
        "throughput.png": _throughput(results, folder / "throughput.png"),
        "context.png": _context(results, folder / "context.png"),
        "latency_cdf.png": _latency_cdf(results, folder / "latency_cdf.png"),
        "reward.png": _reward(results, folder / "reward.png"),
    }
    for r in results:
        suffix = "" if len(results) == 1 else f"-{_label(r)}"
        title = _label(r)
        name = f"workers{suffix}.png"
        plots[name] = mechanism_plots.workers(r.timeline, folder / name, title)
        name = f"trajectory{suffix}.png"
        plots[name] = mechanism_plots.trajectory(r.timeline, r.events, folder / name, title)
        name = f"events{suffix}.png"
        plots[name] = mechanism_plots.timeline_of_events(r.timeline, r.events, folder / name, title)
    page = folder / "report.html"
    page.write_text(_html(results, [name for name, made in plots.items() if made]))
    return page


def _label(r: RunResult) -> str:
    return str(r.measures["policy"])


def _throughput(results: list[RunResult], path: Path) -> bool:
    """Tokens delivered per second in about 30 buckets: deliveries come a batch at a time,
    so one-second buckets would only show the batches."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in results:
        if not r.arrivals:
            continue
        # The whole run, not up to its last delivery: the last update and the wait for
        # it come after, and a run that delivered nothing for a while shows it.
        span = max(_wall_s(r), max(f for f, _, _ in r.arrivals) - r.started_at)
        bucket_s = max(1.0, span / 30)
        buckets: dict[int, int] = defaultdict(int)
        for finished_at, tokens, _ in r.arrivals:
            buckets[int((finished_at - r.started_at) // bucket_s)] += tokens
        last = max(*buckets, math.ceil(span / bucket_s) - 1)
        xs = [(i + 0.5) * bucket_s for i in range(last + 1)]
        ax.plot(xs, [buckets.get(i, 0) / bucket_s for i in range(last + 1)], label=_label(r))
    ax.set_xlim(0, max((_wall_s(r) for r in results), default=1.0))
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("tokens/s delivered")
    ax.set_title("Throughput over time")
    return _save(fig, ax, path, len(results) > 1)


def _wall_s(r: RunResult) -> float:
    wall = r.measures.get("wall_seconds")
    return float(wall) if isinstance(wall, int | float) else 0.0


def _context(results: list[RunResult], path: Path) -> bool:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in results:
        series: dict[str, tuple[list[float], list[float]]] = {}
        for sample in r.timeline:
            by_type: dict[str, list[int]] = defaultdict(list)
            for st in sample.states.values():
                by_type[st.accelerator].extend(res.context for res in st.residents)
            for accel, contexts in by_type.items():
                xs, ys = series.setdefault(accel, ([], []))
                xs.append(sample.at)
                ys.append(sum(contexts) / len(contexts) if contexts else math.nan)
        for accel, (xs, ys) in sorted(series.items()):
            label = accel if len(results) == 1 else f"{_label(r)} {accel}"
            ax.plot(xs, ys, label=label)
    ax.set_xlim(0, max((_wall_s(r) for r in results), default=1.0))
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("mean resident context (tokens)")
    ax.set_title("Mean context per accelerator type")
    return _save(fig, ax, path, True)


def _latency_cdf(results: list[RunResult], path: Path) -> bool:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in results:
        latencies = sorted(lat for _, _, lat in r.arrivals if lat is not None)
        if latencies:
            n = len(latencies)
            ax.step(latencies, [(i + 1) / n for i in range(n)], where="post", label=_label(r))
    ax.set_xlabel("sample latency, first step to delivery (s)")
    ax.set_ylabel("share of samples")
    ax.set_title("Latency CDF")
    return _save(fig, ax, path, len(results) > 1)


def _reward(results: list[RunResult], path: Path) -> bool:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in results:
        rewards = _rewards(r)
        if rewards:
            ax.plot(*zip(*rewards, strict=True), marker="o", label=_label(r))
    ax.set_xlabel("policy version the samples were generated under")
    ax.set_ylabel("mean reward")
    ax.set_title("Reward per version")
    return _save(fig, ax, path, len(results) > 1)


def _save(fig: Figure, ax: Axes, path: Path, legend: bool) -> bool:
    drawn = bool(ax.lines)
    if drawn:
        if legend:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        captioned(fig, caption(path.name))
        fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


# What to look for in each plot, by the name it has in the run's folder (a policy's
# mechanism plots end in `-POLICY` under --compare). Under the plot in its PNG and in the page.
CAPTIONS = {
    "throughput": "Tokens the trainer accepted per second, over the whole run: a steady "
    "plateau is a pool kept busy; dips line up with version advances or struck workers.",
    "context": "Mean context of the resident trajectories per accelerator type: as short "
    "work runs out, the long tail gathers on the highest-affinity type and its line rises.",
    "latency_cdf": "Share of samples delivered within a latency (first step to delivery): "
    "the P95 is where a curve crosses 0.95; further left is a shorter tail.",
    "reward": "Mean reward of the samples generated under each policy version: rising "
    "means the trainer learns from what the pool generated.",
    "workers": mechanism_plots.WORKERS_CAPTION,
    "trajectory": mechanism_plots.TRAJECTORY_CAPTION,
    "events": mechanism_plots.EVENTS_CAPTION,
}


def caption(name: str) -> str:
    stem = name.removesuffix(".png")
    return CAPTIONS.get(stem, CAPTIONS.get(stem.split("-")[0], ""))


def _html(results: list[RunResult], images: list[str]) -> str:
    head = "".join(f"<th>{html.escape(_label(r))}</th>" for r in results)
    rows = []
    for key, label, fmt in ROWS:
        cells = "".join(
            f"<td>{'-' if r.measures.get(key) is None else fmt.format(r.measures[key])}</td>"
            for r in results
        )
        rows.append(f"<tr><th>{html.escape(label)}</th>{cells}</tr>")
    for label, cell in MECHANISM_ROWS:
        cells = "".join(f"<td>{html.escape(cell(r.measures))}</td>" for r in results)
        rows.append(f"<tr><th>{html.escape(label)}</th>{cells}</tr>")
    last = "".join(f"<td>{html.escape(_reward_line(r))}</td>" for r in results)
    rows.append(f"<tr><th>reward first -&gt; last</th>{last}</tr>")
    figures = "".join(
        f'<figure><img src="{name}" alt="{html.escape(caption(name))}">'
        f"<figcaption>{html.escape(caption(name))}</figcaption></figure>"
        for name in images
    )
    return (
        "<!doctype html><meta charset=utf-8><title>cadence run</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        "td,th{padding:.2em .8em;text-align:right}th:first-child{text-align:left}"
        "figure{margin:2em 0}figcaption{color:#444;font-size:.9em}</style>"
        f"<h1>cadence run</h1><table><tr><th></th>{head}</tr>{''.join(rows)}</table>"
        f"{figures}<p>Measures as JSON: <a href=run.json>run.json</a></p>\n"
    )
