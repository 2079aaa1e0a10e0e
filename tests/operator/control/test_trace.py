"""The control loop's trace: each worker's decode steps between observations become one
sample, each applied action a record, and the trainer's accepted trajectories and
updates are read in pages, each recorded once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest

from cadence.common.trace import Summary, read
from cadence.operator.control.trace import TraceRecorder
from cadence.operator.local.run import trace_measures
from cadence.scheduler.actions import Evict, EvictReason, Place
from cadence.trainer.api import Ended, EndedPage, EndedTurn, RunStats
from cadence.trainer.client import TrainerClient
from cadence.worker.api import DecodeSteps, WorkerState
from tests.common.trace_factories import header
from tests.scheduler.factories import make_snapshot, make_worker


class FakeTrainer:
    """Serves `accepted` two at a time, as the trainer pages them, and `updates`."""

    def __init__(self) -> None:
        self.accepted: list[Ended] = []
        self.updates: dict[int, float] = {}

    def accept(self, sid: str, tokens: int) -> None:
        self.accepted.append(
            Ended(
                seq=len(self.accepted),
                id=sid,
                batch=0,
                group=0,
                attempt=0,
                worker="w0",
                prompt_tokens=7,
                turns=[EndedTurn(role="model", tokens=tokens, version=0)],
                failed=False,
                latency_s=1.0,
                finished_at=0.0,
            )
        )

    async def ended(self, after: int = -1, limit: int = 1000) -> EndedPage:
        items = [e for e in self.accepted if e.seq > after][:2]
        return EndedPage(items=items, last=items[-1].seq if items else after)

    async def stats(self) -> RunStats:
        return RunStats(
            version=0,
            consumed=0,
            iterations=1,
            counts={},
            reward_by_version={},
            done=False,
            update_seconds=self.updates,
        )


def _state(wid: str, steps: int, seconds: float) -> WorkerState:
    return WorkerState(
        worker_id=wid,
        accelerator="H800",
        affinity=2,
        engine="emulated",
        version=0,
        kv_capacity_tokens=1000,
        kv_used_tokens=0,
        headroom_tokens=1000,
        residents=[],
        parked=[],
        draining=False,
        decode_steps=DecodeSteps(
            steps=steps, seconds=seconds, sequences=4 * steps, context_tokens=100 * steps
        ),
    )


def _recorder(path: Path, trainer: FakeTrainer, now: list[float]) -> TraceRecorder:
    r = TraceRecorder(path, header(), cast(TrainerClient, trainer), lambda: now[0])
    r.open()
    return r


def test_decode_steps_between_observations_are_one_sample_each(tmp_path: Path) -> None:
    now = [0.0]
    r = _recorder(tmp_path / "t.jsonl", FakeTrainer(), now)
    r.observed({"w0": _state("w0", 10, 1.0)})  # the first reading: nothing to compare
    now[0] = 1.0
    r.observed({"w0": _state("w0", 30, 2.0)})
    r.observed({"w0": _state("w0", 30, 2.0)})  # no step since: no sample
    r.observed({"w0": _state("w0", 5, 0.1)})  # its engine restarted: a new baseline
    r.observed({"w0": _state("w0", 6, 0.2)})
    r.close()
    samples = read(tmp_path / "t.jsonl").steps
    assert [(s.steps, round(s.step_s, 3), s.batch, s.mean_context) for s in samples] == [
        (20, 0.05, 4.0, 100.0),
        (1, 0.1, 4.0, 100.0),
    ]
    assert samples[0].at == 1.0 and samples[0].accelerator == "H800"


def test_applied_actions_are_recorded_as_events(tmp_path: Path) -> None:
    r = _recorder(tmp_path / "t.jsonl", FakeTrainer(), [0.0])
    snapshot = make_snapshot([make_worker("w0", residents=[400]), make_worker("w1")])
    r.applied(
        snapshot, [Evict("w0-r0", "w0", 400, EvictReason.FLOOR), Place("w0-r0", "w1", 0, 400)]
    )
    r.close()
    actions = read(tmp_path / "t.jsonl").actions
    assert [(a.action, a.worker, a.detail) for a in actions] == [
        ("evict", "w0", "floor"),
        ("place", "w1", "move"),
    ]


def test_accepted_trajectories_and_updates_are_recorded_once(tmp_path: Path) -> None:
    trainer, now = FakeTrainer(), [0.0]
    r = _recorder(tmp_path / "t.jsonl", trainer, now)
    for i in range(5):
        trainer.accept(f"s{i}", tokens=i + 1)
    trainer.updates = {1: 2.5}
    asyncio.run(r.read_trainer())
    trainer.accept("s5", tokens=9)
    trainer.updates = {1: 2.5, 2: 3.5}
    asyncio.run(r.read_trainer())  # within the read period: nothing asked
    now[0] = 10.0
    asyncio.run(r.read_trainer())
    asyncio.run(r.read_trainer(now=True))
    r.close()
    t = read(tmp_path / "t.jsonl")
    assert [x.id for x in t.trajectories] == [f"s{i}" for i in range(6)]
    assert [x.response_tokens for x in t.trajectories] == [1, 2, 3, 4, 5, 9]
    assert [(u.version, u.seconds) for u in t.updates] == [(1, 2.5), (2, 3.5)]


def test_a_trace_that_cannot_be_written_stops_the_trace_not_the_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer, now = FakeTrainer(), [0.0]
    r = _recorder(tmp_path / "t.jsonl", trainer, now)
    assert r._writer is not None
    r._writer._file = Path("/dev/full").open("w", encoding="utf-8")  # noqa: SIM115 (a full disk; the recorder closes it)
    r.observed({"w0": _state("w0", 10, 1.0)})
    r.observed({"w0": _state("w0", 30, 2.0)})  # the write fails: logged, not raised
    trainer.accept("s0", tokens=3)
    asyncio.run(r.read_trainer(now=True))  # nothing left to write to: no error either
    r.close(Summary(wall_seconds=1, throughput_tok_s=1))
    assert [m for m in caplog.messages if "stops here" in m]
    assert len(read(tmp_path / "t.jsonl").steps) == 0  # what was written before stays
    assert r.stopped is not None and "could not be written" in r.stopped  # run.json says so


def test_run_json_says_when_its_trace_is_incomplete_or_gone(tmp_path: Path) -> None:
    trainer, now = FakeTrainer(), [0.0]
    whole = _recorder(tmp_path / "whole.jsonl", trainer, now)
    whole.close()
    assert trace_measures(whole) == {"trace": str(tmp_path / "whole.jsonl")}
    gone = _recorder(tmp_path / "gone.jsonl", trainer, now)
    gone.close()
    (tmp_path / "gone.jsonl").unlink()
    said = trace_measures(gone)
    assert said["trace"] is None and "was deleted" in str(said["trace_incomplete"])
    full = _recorder(tmp_path / "full.jsonl", trainer, now)
    assert full._writer is not None
    full._writer._file = Path("/dev/full").open("w", encoding="utf-8")  # noqa: SIM115
    full.observed({"w0": _state("w0", 10, 1.0)})
    full.observed({"w0": _state("w0", 30, 2.0)})
    full.close()
    assert "could not be written" in str(trace_measures(full)["trace_incomplete"])
