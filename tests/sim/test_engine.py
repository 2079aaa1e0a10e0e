"""The simulated engine: macro-stepping equals stepping token by token, and vLLM's
batch limit, prefill and preemption behave as they should."""

from __future__ import annotations

import random

import pytest

from cadence.common.catalog import ACCELERATORS, MODELS
from cadence.common.physics import Deployment, Efficiency
from cadence.sim.engine import ModelledEngine, Request, Stop


def _deployment(capacity: int) -> Deployment:
    return Deployment(MODELS["Qwen3-8B"], ACCELERATORS["H800"], 1, capacity, Efficiency())


def _step_s(d: Deployment, n: int, kv: int) -> float:
    eff = d.efficiency
    bw = d.accelerator.bandwidth.value * eff.bandwidth
    memory = (d.model.weight_bytes + d.model.kv_bytes_per_token * kv) / bw
    compute = 2.0 * d.model.active_params * n / (d.accelerator.flops.value * eff.decode_mfu)
    return eff.step_overhead_s + max(memory, compute)


def test_one_request_takes_exactly_its_steps() -> None:
    d = _deployment(100_000)
    engine = ModelledEngine(d)
    engine.add(Request("a", context=1000, to_go=300))
    stops = engine.run_until(1e9)
    assert [s.request.id for s in stops] == ["a"]
    expected = sum(_step_s(d, 1, 1000 + j) for j in range(300))
    assert stops[0].time == pytest.approx(expected, rel=1e-9)
    assert stops[0].request.context == 1300
    assert stops[0].request.to_go == 0
    assert engine.decoded_tokens == 300


def test_macro_steps_match_token_by_token_decoding() -> None:
    """Against a reference that steps one token at a time: same stop order and times."""
    rng = random.Random(4)
    d = _deployment(1_000_000)
    requests = [(f"r{i}", rng.randint(10, 4000), rng.randint(1, 3000)) for i in range(40)]
    engine = ModelledEngine(d, max_batch=1000)
    for rid, ctx, to_go in requests:
        engine.add(Request(rid, ctx, to_go))
    got = {s.request.id: s.time for s in engine.run_until(1e9)}

    live = {rid: [ctx, to_go] for rid, ctx, to_go in requests}
    t, want = 0.0, {}
    while live:
        t += _step_s(d, len(live), sum(c for c, _ in live.values()))
        for rid in list(live):
            live[rid][0] += 1
            live[rid][1] -= 1
            if live[rid][1] == 0:
                want[rid] = t
                del live[rid]
    assert got.keys() == want.keys()
    for rid, when in want.items():
        assert got[rid] == pytest.approx(when, rel=1e-9)


def test_batch_limit_makes_the_third_request_wait() -> None:
    engine = ModelledEngine(_deployment(100_000), max_batch=2)
    for rid, to_go in (("a", 10), ("b", 50), ("c", 10)):
        engine.add(Request(rid, 100, to_go))
    stops = engine.run_until(1e9)
    assert [s.request.id for s in stops] == ["a", "c", "b"]


def test_prefill_occupies_the_worker_before_decoding() -> None:
    d = _deployment(100_000)
    engine = ModelledEngine(d)
    load = d.prefill_s(8000)
    engine.add(Request("moved", 8000, 1, load_s=load))
    (stop,) = engine.run_until(1e9)
    assert stop.time == pytest.approx(load + _step_s(d, 1, 8000))
    assert engine.prefill_seconds == pytest.approx(load)


def test_transfer_in_flight_is_not_admitted_before_it_lands() -> None:
    engine = ModelledEngine(_deployment(100_000))
    engine.add(Request("late", 100, 1, ready_at=5.0))
    (stop,) = engine.run_until(1e9)
    assert stop.time > 5.0


def test_full_kv_preempts_the_newest_request_and_both_still_finish() -> None:
    d = _deployment(3_000)
    engine = ModelledEngine(d)
    engine.add(Request("old", 1000, 900))
    engine.add(Request("new", 1000, 900))
    seen_max = 0
    stops: list[Stop] = []
    t = 0.0
    while len(stops) < 2:
        t += 0.05
        stops += engine.run_until(t)
        seen_max = max(seen_max, engine.running_kv())
    assert engine.preemptions >= 1
    assert seen_max <= 3_000
    assert [s.request.id for s in stops] == ["old", "new"]
    assert all(s.request.to_go == 0 for s in stops)


def test_removed_request_carries_its_current_context() -> None:
    engine = ModelledEngine(_deployment(100_000))
    engine.add(Request("a", 500, 1000))
    engine.run_until(0.5)
    decoded = engine.steps
    assert 0 < decoded < 1000
    request = engine.remove("a")
    assert request.context == 500 + decoded
    assert request.to_go == 1000 - decoded
    assert engine.idle


def test_a_request_queued_behind_the_batch_limit_starts_when_a_slot_frees() -> None:
    engine = ModelledEngine(_deployment(100_000), max_batch=1)
    engine.add(Request("first", context=100, to_go=50))
    engine.add(Request("queued", context=100, to_go=50))
    stops = engine.run_until(1e9)
    started = dict(engine.started)
    assert started["first"] == 0.0
    assert started["queued"] == stops[0].time  # the moment "first" left the batch
    assert not engine.is_running("queued")


@pytest.mark.parametrize("accelerator", ["H800", "A910X", "L40S"])
def test_the_steps_that_fit_in_a_period_are_the_fewest_that_reach_it(accelerator: str) -> None:
    """The closed form's guess only starts the search: the answer is the smallest k whose
    time reaches the period (or the cap), exactly as counting step by step finds it."""
    d = Deployment(MODELS["Qwen3-8B"], ACCELERATORS[accelerator], 1, 400_000, Efficiency())
    engine = ModelledEngine(d)
    rng = random.Random(7)
    for _ in range(300):
        n, kv = rng.randint(1, 256), rng.randint(0, 300_000)
        seconds, cap = rng.uniform(0.001, 2.0), rng.randint(1, 3_000)
        found = engine._steps_within(seconds, n, kv, cap)
        times = [engine._time_of(k, n, kv) for k in range(1, cap + 1)]
        reaching = [k for k, t in enumerate(times, start=1) if t >= seconds]
        expected = cap if times[-1] <= seconds else reaching[0]
        assert found == expected, (n, kv, seconds, cap)
