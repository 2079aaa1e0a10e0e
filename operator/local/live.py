"""The live view of `cadence run` (rich): a line for the run (version, batches trained,
pending per version, throughput, P50/P95 so far, the newest reward), a line for what the
scheduler did so far (evictions by reason, moves, advances) and a row per worker (its role,
version, residents, resident context, parked, KV headroom). It renders `run.Progress`; it
reads nothing."""

from __future__ import annotations

import time
from collections import Counter

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from cadence.operator.local.mechanism import newest_version, role
from cadence.operator.local.run import Progress


def render(p: Progress) -> RenderableType:
    elapsed = time.monotonic() - p.started
    stats = p.stats
    states = p.latest.states if p.latest is not None else {}
    pending: Counter[int] = Counter()
    for st in states.values():
        pending.update(t.version for t in st.parked)
    head = Text(f"cadence run · policy {p.policy} · {elapsed:5.1f} s", style="bold")
    if stats is not None:
        rewards = stats.reward_by_version
        reward = f"{rewards[max(rewards)]:.2f} (v{max(rewards)})" if rewards else "-"
        rate = stats.tokens_delivered / elapsed if elapsed > 0 else 0.0
        waiting = ", ".join(f"v{v}: {n}" for v, n in sorted(pending.items())) or "none"
        head.append(
            f"\nversion {stats.version} · trained {stats.consumed}/{stats.iterations} · "
            f"pending {waiting} · {rate:,.0f} tok/s · "
            f"P50 {stats.latency_p50_s:.2f} s · P95 {stats.latency_p95_s:.2f} s · "
            f"reward {reward}",
            style="",
        )
    if p.actions:
        evicted = ", ".join(
            f"{n} {detail}" for (kind, detail), n in sorted(p.actions.items()) if kind == "evict"
        )
        head.append(
            f"\nevicted {evicted or 'none'} · moved {p.actions.get(('place', 'move'), 0)} · "
            f"advanced {sum(n for (kind, _), n in p.actions.items() if kind == 'advance')}",
            style="",
        )
    workers = Table(box=box.SIMPLE, pad_edge=False)
    for name, justify in (
        ("worker", "left"),
        ("accelerator", "left"),
        ("rank", "right"),
        ("role", "left"),
        ("version", "right"),
        ("resident", "right"),
        ("context", "right"),
        ("parked", "right"),
        ("headroom", "right"),
    ):
        workers.add_column(name, justify=justify)  # type: ignore[arg-type]
    newest = newest_version(states)
    for wid, st in sorted(states.items()):
        workers.add_row(
            wid,
            st.accelerator,
            str(st.affinity),
            role(st, newest),
            "-" if st.version is None else str(st.version),
            str(len(st.residents)),
            f"{sum(r.context for r in st.residents):,}",
            str(len(st.parked)),
            f"{st.headroom_tokens:,}",
        )
    for wid in sorted(p.lost - set(states)):
        workers.add_row(wid, "", "", "", "", "", "", "", "lost", style="red")
    parts: list[RenderableType] = [head, workers]
    parts.extend(Text(e, style="yellow") for e in p.events[-3:])
    return Group(*parts)
