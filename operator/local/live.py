"""What `cadence run` shows while it runs. On a terminal, a live view (rich): a line for
the run (version, batches trained, pending per version, throughput, P50/P95 so far, the
newest reward), a line for what the scheduler did so far (evictions by reason, moves,
advances) and a row per worker (its role, version, residents, resident context, parked, KV
headroom). In a log or a pipe, `Lines`: the same two lines as one, every few seconds, and
a warning when emulated workers cannot keep the pace their time compression asks. Both
render `run.Progress`; they read nothing."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from cadence.operator.local.mechanism import newest_version, role
from cadence.operator.local.run import Progress


def _run_line(p: Progress, elapsed: float) -> str | None:
    stats = p.stats
    if stats is None:
        return None
    states = p.latest.states if p.latest is not None else {}
    pending: Counter[int] = Counter()
    for st in states.values():
        pending.update(t.version for t in st.parked)
    rewards = stats.reward_by_version
    reward = f"{rewards[max(rewards)]:.2f} (v{max(rewards)})" if rewards else "-"
    rate = stats.tokens_delivered / elapsed if elapsed > 0 else 0.0
    waiting = ", ".join(f"v{v}: {n}" for v, n in sorted(pending.items())) or "none"
    return (
        f"version {stats.version} · trained {stats.consumed}/{stats.iterations} · "
        f"pending {waiting} · {rate:,.0f} tok/s · "
        f"P50 {stats.latency_p50_s:.2f} s · P95 {stats.latency_p95_s:.2f} s · "
        f"reward {reward}"
    )


def _actions_line(p: Progress) -> str | None:
    if not p.actions:
        return None
    evicted = ", ".join(
        f"{n} {detail}" for (kind, detail), n in sorted(p.actions.items()) if kind == "evict"
    )
    return (
        f"evicted {evicted or 'none'} · moved {p.actions.get(('place', 'move'), 0)} · "
        f"advanced {sum(n for (kind, _), n in p.actions.items() if kind == 'advance')}"
    )


def render(p: Progress) -> RenderableType:
    elapsed = time.monotonic() - p.started
    head = Text(f"cadence run · policy {p.policy} · {elapsed:5.1f} s", style="bold")
    for line in (_run_line(p, elapsed), _actions_line(p)):
        if line is not None:
            head.append(f"\n{line}", style="")
    states = p.latest.states if p.latest is not None else {}
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


SLOWER_WARN = 1.5  # wall time over modelled time, across emulated workers, worth a warning


class Lines:
    """Progress for logs and pipes: one line every `every_s` seconds of the run (its time,
    the run line and the actions line of the live view), and a warning, at most once a
    minute, when the emulated workers ran more than `SLOWER_WARN` times slower than their
    compressed model over the last interval: their timings then no longer mean what the
    simulator's do."""

    def __init__(
        self,
        compression: float,
        write: Callable[[str], None],
        *,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.compression = compression
        self.write = write
        self.every_s = every_s
        self.clock = clock
        self.last_line: float | None = None
        self.last_warning: float | None = None
        self.pace = (0.0, 0.0)  # modelled and late seconds at the last line

    def __call__(self, p: Progress) -> None:
        now = self.clock()
        if self.last_line is not None and now - self.last_line < self.every_s:
            return
        self.last_line = now
        elapsed = now - p.started
        parts = [f"{elapsed:.0f} s", _run_line(p, elapsed), _actions_line(p)]
        self.write("cadence run · " + " · ".join(part for part in parts if part))
        slower = self._slower(p)
        quiet = self.last_warning is not None and now - self.last_warning < 60
        if slower is not None and slower > SLOWER_WARN and not quiet:
            self.last_warning = now
            self.write(self.behind(slower))

    def _slower(self, p: Progress) -> float | None:
        """Wall time over modelled time of the emulated workers since the last line."""
        states = p.latest.states.values() if p.latest is not None else ()
        paces = [st.pace for st in states if st.pace is not None]
        modelled = sum(pace.modelled_s for pace in paces)
        late = sum(pace.late_s for pace in paces)
        (was_modelled, was_late), self.pace = self.pace, (modelled, late)
        # A replaced worker starts its counts again: skip an interval that went back.
        if modelled <= was_modelled or late < was_late:
            return None
        return 1 + (late - was_late) / (modelled - was_modelled)

    def behind(self, slower: float) -> str:
        keeps_pace = self.compression / slower
        return (
            f"warning: the emulated accelerators run {slower:.1f}x slower than "
            f"--compression {self.compression:g} asks (this machine is busy or small), so "
            "this run's times and rates will not match the simulator's; "
            f"--compression {keeps_pace:.2g} or lower keeps pace (a lower compression runs "
            "slower: more wall seconds per modelled second)"
        )
