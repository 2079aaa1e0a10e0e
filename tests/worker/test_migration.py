"""Moves between emulated workers: within a transfer group the KV is pulled over the
modelled link (its bytes' time instead of a prefill), across groups or under
`migration: reprefill` it is re-prefilled, and the move's record and the worker's
counts say which; the tokens are those of an uninterrupted run either way."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from cadence.common.physics import LINK_BYTES_PER_S, transfer_s
from cadence.worker.api import AdvanceRequest, Migration, PlaceResponse
from cadence.worker.core import WorkerCore
from cadence.worker.emulated import EmulatedEngine

from .factories import CountingSource, Pool, fresh, moved


def _decode(core: WorkerCore, steps: int) -> None:
    async def go() -> None:
        for _ in range(steps):
            await core.step()

    asyncio.run(go())


def _move(
    pool: Pool, destination: WorkerCore, migration: Migration = "auto"
) -> tuple[PlaceResponse, float, list[int]]:
    """A trajectory decodes 10 tokens on "a", departs and is placed on `destination`:
    the placement's answer, the modelled seconds of its first step there, and every
    token it ends with."""
    a = pool.cores["a"]
    asyncio.run(a.place(fresh("t", max_tokens=30)))
    _decode(a, 10)
    a.evict("t")
    placed = asyncio.run(
        destination.place(moved("t", pool.source("a"), attempt=1, migration=migration))
    )
    before = pool.clock.t
    _decode(destination, 1)
    first = pool.clock.t - before

    async def finish() -> list[int]:
        while destination.resident:
            await destination.step()
        state = destination.finished.pop()
        return [t for turn in state.turns for t in turn.token_ids]

    return placed, first, asyncio.run(finish())


def _reference() -> list[int]:
    pool = Pool()
    a = pool.add("a")
    asyncio.run(a.place(fresh("t", max_tokens=30)))

    async def finish() -> list[int]:
        while a.resident:
            await a.step()
        return [t for turn in a.finished.pop().turns for t in turn.token_ids]

    return asyncio.run(finish())


def test_a_move_within_a_transfer_group_pulls_the_kv_over_the_link() -> None:
    pool = Pool()
    pool.add("a")
    b = pool.add("b")
    assert pool.cores["a"].transfer_group == b.transfer_group is not None
    placed, first, tokens = _move(pool, b)
    assert tokens == _reference()
    assert (placed.moved, placed.move_reason) == ("kv", None)
    engine = b.engine
    assert isinstance(engine, EmulatedEngine)
    pull = transfer_s(26, engine.deployment.model, LINK_BYTES_PER_S)
    step = engine.pacer.step_s(1, 26)
    assert first == pytest.approx(pull + step)  # the pull's time, not a prefill's
    moves = b.state().moves
    assert (moves.kv, moves.reprefill, moves.kv_tokens) == (1, 0, 26)
    assert moves.kv_bytes == 26 * engine.kv_bytes_per_token


@pytest.mark.parametrize(
    ("accelerator", "kv_link", "migration", "said"),
    [
        ("A910X", True, "auto", "the source offered no KV"),
        ("H800", False, "auto", "cannot pull KV"),
        ("H800", True, "reprefill", "the run's migration is reprefill"),
    ],
)
def test_a_move_that_cannot_or_may_not_pull_re_prefills_and_says_why(
    accelerator: str, kv_link: bool, migration: Migration, said: str
) -> None:
    pool = Pool()
    pool.add("a")
    c = pool.add("c", accelerator=accelerator, kv_link=kv_link)
    placed, first, tokens = _move(pool, c, migration)
    assert tokens == _reference()
    assert placed.moved == "reprefill" and said in (placed.move_reason or "")
    engine = c.engine
    assert isinstance(engine, EmulatedEngine)
    assert first == pytest.approx(engine.pacer.prefill_s(26) + engine.pacer.step_s(1, 26))
    moves = c.state().moves
    assert (moves.kv, moves.reprefill, moves.reprefill_tokens) == (0, 1, 26)


class _Reloadable(CountingSource):
    def load_weights(self, path: Path) -> None:
        pass  # the tokens stay a function of the context; only the version changes


def test_a_source_that_advanced_since_the_trajectory_left_offers_no_kv(tmp_path: Path) -> None:
    """The blocks an export would compute now are the new policy's, not those of the
    version the trajectory runs under: the destination re-prefills instead."""
    pool = Pool()
    a, b = pool.add("a", source=_Reloadable()), pool.add("b")
    asyncio.run(a.place(fresh("t", max_tokens=30)))
    _decode(a, 10)
    a.evict("t")

    async def weights(uri: str) -> bytes:
        return b"version 1"

    a.fetch_weights, a.weights_dir = weights, tmp_path
    digest = hashlib.sha256(b"version 1").hexdigest()
    asyncio.run(a.advance(AdvanceRequest(version=1, weights_uri="v1", sha256=digest)))
    placed = asyncio.run(b.place(moved("t", pool.source("a"), attempt=1)))
    assert placed.moved == "reprefill" and "the source offered no KV" in (placed.move_reason or "")
    assert a.counts["exports_stale"] == 1 and a.counts["exports"] == 0


def test_a_worker_reports_its_transfer_group_and_link() -> None:
    pool = Pool()
    h800, other = pool.add("a"), pool.add("b", accelerator="A910X")
    state = h800.state()
    assert state.transfer_group is not None and state.transfer_group != other.transfer_group
    assert state.kv_link_bytes_per_s == LINK_BYTES_PER_S
    assert state.kv_bytes_per_token == h800.engine.kv_bytes_per_token > 0
    assert pool.add("c", kv_link=False).state().transfer_group is None
