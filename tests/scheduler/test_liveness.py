"""Multi-cycle runs: every run finishes, every sample ends once, moves stay bounded."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cadence.scheduler import Knobs

from .toyworld import ToyConfig, ToyWorker, ToyWorld


def _finish(cfg: ToyConfig, max_steps: int = 40_000) -> ToyWorld:
    world = ToyWorld(cfg)
    assert world.run(max_steps), (
        f"stalled at step {world.step_no}: consumed {world.consumed}/{cfg.iterations}, "
        f"newest v{world.newest}, sources {dict(world.state.sources)}"
    )
    return world


def _assert_ended_once(world: ToyWorld) -> None:
    cfg = world.cfg
    assert world.admitted == cfg.iterations * cfg.batch_size
    assert len(world.delivered) == len(set(world.delivered))
    assert len(world.delivered) == world.admitted * cfg.samples


def test_regression_first_source_alone_on_the_newest_version() -> None:
    """B = 2, eta = 1, two workers: the first source empties and advances onto the newest
    version, where it is the only worker; version 0's tail stays on the other. Read
    literally, the paper's source rule ("the weakest affinity among workers still serving
    v") then makes that lone worker the departure-only source of its new version once its
    short end runs out: what it departs has no other worker to go to and it can never
    empty, so the batch never completes and training stops. The architecture's "provided another
    worker of v remains" is what keeps this run alive."""
    cfg = ToyConfig(
        workers=[ToyWorker("weak", 600, affinity=0), ToyWorker("strong", 600, affinity=1)],
        batch_size=2,
        samples=3,
        iterations=6,
        knobs=Knobs(h_min=40, delta=8, eta=1, min_decode=8),
        median_length=80,
        max_length=500,
        seed=0,
    )
    world = _finish(cfg)
    _assert_ended_once(world)
    assert any(alone for *_, alone in world.source_advances), world.source_advances


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    n_workers=st.integers(1, 5),
    speeds=st.lists(st.integers(1, 3), min_size=5, max_size=5),
    affinities=st.lists(st.integers(0, 2), min_size=5, max_size=5),
    capacity=st.integers(700, 2000),
    eta=st.integers(0, 3),
    batch_size=st.integers(1, 3),
    samples=st.integers(1, 4),
    iterations=st.integers(1, 5),
    h_min=st.integers(0, 80),
    delta=st.integers(0, 20),
    min_decode=st.integers(1, 40),
    tool_call_rate=st.sampled_from([0.0, 0.0, 0.1]),
    seed=st.integers(0, 2**16),
)
def test_random_runs_finish_with_bounded_moves(
    n_workers: int,
    speeds: list[int],
    affinities: list[int],
    capacity: int,
    eta: int,
    batch_size: int,
    samples: int,
    iterations: int,
    h_min: int,
    delta: int,
    min_decode: int,
    tool_call_rate: float,
    seed: int,
) -> None:
    max_length = capacity - h_min - delta - 60  # prompt + observations fit under the floor
    cfg = ToyConfig(
        workers=[
            ToyWorker(f"w{i}", capacity, affinity=affinities[i], speed=speeds[i])
            for i in range(n_workers)
        ],
        batch_size=batch_size,
        samples=samples,
        iterations=iterations,
        knobs=Knobs(h_min=h_min, delta=delta, eta=eta, min_decode=min_decode),
        median_length=max(20, max_length // 8),
        max_length=max_length,
        tool_call_rate=tool_call_rate,
        env_steps=2,
        observation=4,
        seed=seed,
    )
    world = _finish(cfg)
    _assert_ended_once(world)
    # Anti-thrash bound: a trajectory is evicted only after decoding min_decode tokens
    # since its last placement, so it cannot move more than length / min_decode times.
    longest = max(t.length for t in world.trajectories.values())
    assert world.max_moves <= longest // min_decode


def test_moves_per_trajectory_over_seeded_pools() -> None:
    """Seeded heterogeneous pools under pressure: report the most any trajectory moved
    (run with -s to see it) and hold it to the anti-thrash bound."""
    worst = (0, 0)  # (moves, bound)
    for seed in range(12):
        min_decode = 8 + 4 * (seed % 4)
        cfg = ToyConfig(
            workers=[
                ToyWorker("fast", 900, affinity=2, speed=2),
                ToyWorker("mid", 900, affinity=1),
                ToyWorker("slow", 900, affinity=0),
            ],
            batch_size=3,
            samples=6,
            iterations=4,
            knobs=Knobs(h_min=60, delta=10, eta=seed % 4, min_decode=min_decode),
            median_length=90,
            max_length=700,
            tool_call_rate=0.05 * (seed % 3),
            seed=seed,
        )
        world = _finish(cfg)
        _assert_ended_once(world)
        bound = max(t.length for t in world.trajectories.values()) // min_decode
        assert world.max_moves <= bound
        worst = max(worst, (world.max_moves, bound))
    print(f"most moves of any trajectory: {worst[0]} (bound {worst[1]})")
