"""The live view of `cadence run`: what a person watching the run reads from it."""

from __future__ import annotations

import time

from rich.console import Console

from cadence.operator.local.live import Lines, render
from cadence.operator.local.mechanism import Sample
from cadence.operator.local.run import Progress
from cadence.trainer.api import RunStats
from cadence.worker.api import Pace, ParkedInfo, ResidentInfo, WorkerState


def _state(wid: str, version: int, residents: int, parked_versions: list[int]) -> WorkerState:
    return WorkerState(
        worker_id=wid,
        accelerator="H800" if wid.startswith("h800") else "A910X",
        affinity=2 if wid.startswith("h800") else 1,
        engine="emulated",
        version=version,
        kv_capacity_tokens=10_000,
        kv_used_tokens=40 * residents,
        headroom_tokens=10_000 - 40 * residents,
        residents=[
            ResidentInfo(
                id=f"{wid}-r{i}",
                attempt=0,
                version=version,
                context=40,
                generated=12,
                decoded_since_placement=12,
                state="decoding",
            )
            for i in range(residents)
        ],
        parked=[
            ParkedInfo(id=f"{wid}-p{i}", attempt=0, version=v, context=30, reason="evicted")
            for i, v in enumerate(parked_versions)
        ],
        draining=False,
    )


def test_the_view_shows_each_worker_pending_per_version_and_the_run() -> None:
    progress = Progress("cadence", started=time.monotonic() - 10)
    progress.latest = Sample(
        9.5,
        {
            "h800-0": _state("h800-0", 3, 2, [2, 3]),
            "a910x-0": _state("a910x-0", 2, 5, [2]),
        },
    )
    progress.lost = frozenset({"a910x-1"})
    progress.events = ["killed host-1 (a910x-1)"]
    progress.actions = {("evict", "floor"): 4, ("evict", "lift"): 1, ("place", "move"): 5}
    progress.stats = RunStats(
        version=3,
        consumed=3,
        iterations=30,
        counts={},
        reward_by_version={0: 0.05, 2: 0.31},
        done=False,
        tokens_delivered=5_000,
        latency_p50_s=0.4,
        latency_p95_s=0.9,
    )
    console = Console(width=120, record=True)
    console.print(render(progress))
    text = console.export_text()
    assert "version 3" in text and "trained 3/30" in text
    assert "pending v2: 2, v3: 1" in text
    assert "500 tok/s" in text  # 5,000 tokens in 10 s
    assert "P50 0.40 s" in text and "P95 0.90 s" in text and "reward 0.31 (v2)" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    assert "evicted 4 floor, 1 lift · moved 5 · advanced 0" in text
    # a910x-0 still serves version 2 while h800-0 serves 3: it finishes version 2's tail
    assert rows["h800-0"][1:] == ["H800", "2", "throughput", "3", "2", "80", "2", "9,920"]
    assert rows["a910x-0"][1:] == ["A910X", "1", "tail", "2", "5", "200", "1", "9,800"]
    assert rows["a910x-1"][-1] == "lost"
    assert "killed host-1 (a910x-1)" in text


def _paced(wid: str, modelled_s: float, late_s: float) -> WorkerState:
    state = _state(wid, 1, 1, [])
    return state.model_copy(update={"pace": Pace(modelled_s=modelled_s, late_s=late_s)})


def test_in_a_log_the_run_prints_a_line_every_interval_and_warns_when_emulation_lags() -> None:
    now = [100.0]
    lines: list[str] = []
    out = Lines(20.0, lines.append, every_s=10.0, clock=lambda: now[0])
    progress = Progress("cadence", started=90.0)
    progress.actions = {("evict", "floor"): 2, ("place", "move"): 1}

    def cycle(at: float, modelled_s: float, late_s: float) -> None:
        now[0] = at
        states = {
            "h800-0": _paced("h800-0", modelled_s, late_s),
            "a910x-0": _state("a910x-0", 1, 0, []),
        }
        progress.latest = Sample(at - 90.0, states)
        out(progress)

    cycle(100.0, 5.0, 0.5)  # on pace: 10% late
    cycle(105.0, 7.0, 0.6)  # within the interval: nothing printed
    assert lines == ["cadence run · 10 s · evicted 2 floor · moved 1 · advanced 0"]
    cycle(110.0, 9.0, 4.5)  # 4 modelled s took 8 s: twice slower than asked
    assert lines[-2].startswith("cadence run · 20 s")
    warning = lines[-1]
    assert "2.0x slower than --compression 20 asks" in warning
    assert "--compression 10 or lower keeps pace" in warning
    cycle(120.0, 11.0, 8.5)  # still behind, but warned a minute ago at most once
    assert len(lines) == 4 and not lines[-1].startswith("warning")
    cycle(171.0, 13.0, 12.5)
    assert lines[-1].startswith("warning")
    cycle(181.0, 23.0, 12.6)  # back on pace
    assert not lines[-1].startswith("warning")
