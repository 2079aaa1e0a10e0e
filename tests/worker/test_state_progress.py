"""A host sends a worker that only decoded as progress on the state it last sent whole,
and its reader rebuilds exactly the state the worker has: through decode steps,
placements, evictions and a second reader, for many workers."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from cadence.worker.api import ParkedInfo, WorkerState
from cadence.worker.client import HostClient
from cadence.worker.host import create_host_app
from cadence.worker.state_progress import advanced, progress_of

from .factories import Pool, fresh

TOKEN = "s3cret"


def _first(state: WorkerState, **change: int) -> WorkerState:
    """`state` with its first resident changed."""
    first, *rest = state.residents
    return state.model_copy(update={"residents": [first.model_copy(update=change), *rest]})


def test_decoding_alone_is_progress_and_any_other_change_is_whole() -> None:
    pool = Pool()
    core = pool.add("h800-0")
    for i in range(3):
        asyncio.run(core.place(fresh(f"t{i}", prompt=10 + i)))
    asyncio.run(core.step())
    base = core.state()
    for _ in range(3):
        asyncio.run(core.step())
    now = core.state()
    step = progress_of(base, now)
    assert step is not None and step.decoded == [3, 3, 3]
    assert advanced(base, step) == now
    assert progress_of(base, base) is not None
    changed = [
        now.model_copy(update={"version": 7}),
        now.model_copy(update={"draining": True}),
        now.model_copy(update={"delivering": ["t9"]}),
        now.model_copy(update={"residents": now.residents[:2]}),
        now.model_copy(update={"headroom_tokens": now.headroom_tokens - 1}),
        now.model_copy(
            update={
                "parked": [ParkedInfo(id="p", attempt=0, version=0, context=5, reason="evicted")]
            }
        ),
        _first(now, attempt=1),
        _first(now, context=999),
    ]
    for other in changed:
        assert progress_of(base, other) is None
    assert progress_of(now, base) is None  # decoding never goes backwards


def test_a_reader_rebuilds_every_workers_state_through_steps_and_changes() -> None:
    rng = random.Random(3)
    pool = Pool()
    cores = {f"h800-{i}": pool.add(f"h800-{i}") for i in range(6)}
    placed = 0

    async def go() -> tuple[int, int]:
        nonlocal placed
        transport = httpx.ASGITransport(app=create_host_app(cores, TOKEN))
        reader = HostClient("http://host", TOKEN, transport=transport)
        other = HostClient("http://host", TOKEN, transport=transport)
        wholes = progresses = 0
        try:
            for round_ in range(40):
                core = rng.choice(list(cores.values()))
                what = rng.random()
                if what < 0.25:
                    await core.place(fresh(f"t{placed}", prompt=rng.randint(4, 20)))
                    placed += 1
                elif what < 0.35 and core.resident:
                    core.evict(rng.choice(list(core.resident)))
                for c in cores.values():
                    if rng.random() < 0.7 and c.resident:
                        await c.step()
                if round_ % 10 == 9:
                    await other.states()  # another reader: the first one's next is whole
                observed = await reader.states()
                assert {w: o.current() for w, o in observed.items()} == {
                    w: c.state() for w, c in cores.items()
                }
                wholes += sum(o.progress is None for o in observed.values())
                progresses += sum(o.progress is not None for o in observed.values())
        finally:
            await reader.aclose()
            await other.aclose()
        return wholes, progresses

    wholes, progresses = asyncio.run(go())
    assert progresses > 2 * wholes  # most answers were progress


def test_progress_that_does_not_fit_its_base_is_refused() -> None:
    pool = Pool()
    core = pool.add("h800-0")
    asyncio.run(core.place(fresh("t", prompt=10)))
    base = core.state()
    step = progress_of(base, base)
    assert step is not None
    with pytest.raises(ValueError, match="progress of 1 residents"):
        advanced(base.model_copy(update={"residents": []}), step)
