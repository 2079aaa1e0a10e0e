"""The control loop's own checks, on worker views built by hand (no processes)."""

from __future__ import annotations

from cadence.operator.control.config import LoopConfig
from cadence.operator.control.loop import ControlLoop
from cadence.scheduler import CadencePolicy, Knobs, StepCost, WorkerView
from cadence.trainer.client import TrainerClient

FAST = StepCost(weights_s=0.010, kv_token_s=0.0, seq_s=0.0)  # 100 steps a second


def _loop(knobs: Knobs) -> ControlLoop:
    trainer = TrainerClient("http://127.0.0.1:9", "token")  # never called here
    return ControlLoop(CadencePolicy(), LoopConfig(knobs=knobs), trainer, {}, "token")


def _worker(wid: str, cost: StepCost | None) -> WorkerView:
    return WorkerView(wid, "H800", 0, 0, 400_000, max_seqs=256, cost=cost)


def test_a_pinned_floor_below_a_workers_growth_is_warned_of_once_per_worker() -> None:
    loop = _loop(Knobs(h_min=256, delta=16, eta=1))
    workers = [_worker("w0", FAST), _worker("w1", None)]  # w1's engine cannot say
    loop._check_floor(workers)
    loop._check_floor(workers)
    assert list(loop.floor_warnings) == ["w0"]
    assert loop.floor_warnings["w0"].startswith("h_min 256 is below one control period's")


def test_auto_floors_are_never_warned_of() -> None:
    loop = _loop(Knobs(h_min=256, delta=16, eta=1, auto_h_min=True))
    loop._check_floor([_worker("w0", FAST)])
    assert loop.floor_warnings == {}
