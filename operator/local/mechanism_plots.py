"""The report's plots of the scheduler at work, one set per policy: each worker's resident
context and batch over time with its role shaded (tail or throughput), one long
trajectory's residence and moves, and every eviction, move and advance on a timeline.

They are drawn from the run's cycles (`Sample`) and applied actions (`Event`), so they
show what the workers held, not what the scheduler meant them to.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from cadence.common.captions import captioned
from cadence.operator.control.events import Event
from cadence.operator.local.mechanism import Sample, newest_version, role

_ROLE_COLOURS = {"tail": "#f4c7a1", "throughput": "#c9dcf2"}
_EVENT_STYLE = {  # (marker, colour, label)
    ("evict", "floor"): ("v", "#d62728", "evicted: below floor"),
    ("evict", "source"): ("v", "#9467bd", "evicted: concentration source"),
    ("evict", "lift"): ("v", "#ff7f0e", "evicted: lifted to a faster worker"),
    ("evict", "make_room"): ("v", "#8c564b", "evicted: room for a longer one"),
    ("evict", "interrupt"): ("v", "#7f7f7f", "evicted: interrupted for new weights"),
    ("evict", "repack"): ("v", "#bcbd22", "evicted: repacked"),
    ("place", "move"): ("^", "#2ca02c", "moved in"),
    ("advance", ""): ("|", "#1f77b4", "advanced"),
}


WORKERS_CAPTION = (
    "Each worker's resident context (black, left axis) and batch (blue, right axis), shaded "
    "by role: a tail worker (orange) finishes an older version's long trajectories while "
    "throughput workers (blue) take fresh work; under Cadence the tail sits on the "
    "highest-affinity workers, listed first."
)
TRAJECTORY_CAPTION = (
    "The longest trajectory that moved: the worker it was resident on and its context over "
    "time; a red mark is an eviction, a green one a placement, and after a move its context "
    "goes on growing where it landed instead of starting again."
)
EVENTS_CAPTION = (
    "What the scheduler did, a row per worker: evictions come as workers reach their KV "
    "floor, moves place evicted work elsewhere, advances follow each new policy version."
)


def _workers(timeline: Sequence[Sample]) -> list[str]:
    """Worker ids, highest affinity first, then by id."""
    seen: dict[str, int] = {}
    for sample in timeline:
        for wid, st in sample.states.items():
            seen[wid] = st.affinity
    return sorted(seen, key=lambda w: (-seen[w], w))


def workers(timeline: Sequence[Sample], path: Path, title: str) -> bool:
    """Per worker: resident KV tokens and batch (residents) over time, background shaded
    by the worker's role. The seed paper's Figure 13, from a real run."""
    ids = _workers(timeline)
    if not ids or len(timeline) < 2:
        return False
    fig, axes = plt.subplots(len(ids), 1, figsize=(9, 1.4 * len(ids) + 0.8), sharex=True)
    axes = axes if len(ids) > 1 else [axes]
    for ax, wid in zip(axes, ids, strict=True):
        xs, kv, batch = [], [], []
        for here, after in itertools.pairwise(timeline):
            st = here.states.get(wid)
            if st is None:
                continue
            shade = _ROLE_COLOURS.get(role(st, newest_version(here.states)))
            if shade is not None:
                ax.axvspan(here.at, after.at, color=shade, lw=0)
            xs.append(here.at)
            kv.append(sum(r.context for r in st.residents))
            batch.append(len(st.residents))
        ax.plot(xs, kv, color="#333333", lw=1)
        ax.set_ylabel("KV tok", fontsize=8)
        twin = ax.twinx()
        twin.plot(xs, batch, color="#1f77b4", lw=0.8, alpha=0.8)
        twin.set_ylabel("batch", fontsize=8, color="#1f77b4")
        st0 = next(s.states[wid] for s in timeline if wid in s.states)
        ax.set_title(f"{wid} ({st0.accelerator}, affinity {st0.affinity})", fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
        twin.tick_params(labelsize=7)
    axes[-1].set_xlabel("seconds since start (shaded: orange tail role, blue throughput role)")
    fig.suptitle(f"{title}: resident context and batch per worker", fontsize=10)
    captioned(fig, WORKERS_CAPTION)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def longest_moved(timeline: Sequence[Sample], events: Sequence[Event]) -> str | None:
    """The trajectory that reached the longest context among those that moved at least
    once (else the longest of all)."""
    moved = {e.trajectory for e in events if e.kind == "place" and e.detail == "move"}
    longest: dict[str, int] = {}
    for sample in timeline:
        for st in sample.states.values():
            for r in st.residents:
                longest[r.id] = max(longest.get(r.id, 0), r.context)
    pool = {t: c for t, c in longest.items() if t in moved} or longest
    return max(pool, key=lambda t: (pool[t], t)) if pool else None


def trajectory(timeline: Sequence[Sample], events: Sequence[Event], path: Path, title: str) -> bool:
    """One long trajectory: the worker holding it and its context over time, its
    evictions and moves marked. The seed paper's Figure 14, from a real run."""
    tid = longest_moved(timeline, events)
    if tid is None:
        return False
    ids = _workers(timeline)
    row = {w: i for i, w in enumerate(ids)}
    xs, ys, contexts = [], [], []
    for sample in timeline:
        for wid, st in sample.states.items():
            hit = next((r for r in st.residents if r.id == tid), None)
            if hit is not None:
                xs.append(sample.at)
                ys.append(row[wid])
                contexts.append(hit.context)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.5), sharex=True)
    top.scatter(xs, ys, s=4, color="#333333")
    for e in events:
        if e.trajectory == tid and e.worker in row:
            marker = "^" if e.kind == "place" else "v"
            colour = "#2ca02c" if e.kind == "place" else "#d62728"
            top.scatter([e.at], [row[e.worker]], marker=marker, color=colour, s=40, zorder=3)
    top.set_yticks(range(len(ids)), ids, fontsize=7)
    top.set_ylabel("resident on")
    top.set_title(f"{title}: trajectory {tid} (green: placed, red: evicted)", fontsize=9)
    bottom.plot(xs, contexts, ".", ms=2, color="#333333")
    bottom.set_ylabel("context (tokens)")
    bottom.set_xlabel("seconds since start")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    captioned(fig, TRAJECTORY_CAPTION)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def timeline_of_events(
    timeline: Sequence[Sample], events: Sequence[Event], path: Path, title: str
) -> bool:
    """Every eviction, move and advance: a row per worker, a mark per action."""
    ids = _workers(timeline)
    if not ids or not events:
        return False
    row = {w: i for i, w in enumerate(ids)}
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(ids) + 1.6))
    for (kind, detail), (marker, colour, label) in _EVENT_STYLE.items():
        hits = [
            e for e in events if e.kind == kind and (detail in ("", e.detail)) and e.worker in row
        ]
        if hits:
            ax.scatter(
                [e.at for e in hits],
                [row[e.worker] for e in hits],
                marker=marker,
                color=colour,
                s=30,
                alpha=0.7,
                label=f"{label} ({len(hits)})",
            )
    ax.set_yticks(range(len(ids)), ids, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since start")
    ax.set_title(f"{title}: evictions, moves and advances", fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a run with no event has nothing to key
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    captioned(fig, EVENTS_CAPTION)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
