"""The control loop's reconcile, apply, requeue and lost-worker logic, in one process:
the real worker and trainer apps over an ASGI router, emulated engines on a fake clock
(`harness.py`). Each test drives cycles and decode steps itself, so none waits on time."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cadence.scheduler.actions import Place
from cadence.scheduler.snapshot import Knobs, Resident
from cadence.worker.api import HostStates, WorkerState

from .harness import LocalPool, trainer

KNOBS = Knobs(h_min=16, delta=8, eta=1, min_decode=1, auto_h_min=True, auto_delta=True)


@pytest.fixture
def pool(tiny_model: Path, tmp_path: Path) -> Iterator[LocalPool]:
    t = trainer(tiny_model, tmp_path / "trainer")
    yield LocalPool(t)
    t.ledger.close()


def test_a_batch_is_placed_decoded_and_delivered_once_through_the_endpoints(
    pool: LocalPool,
) -> None:
    pool.add_worker("w0")
    pool.add_worker("w1")

    async def go() -> None:
        loop = pool.loop(KNOBS)
        await pool.run_until_delivered(loop, samples=8, rounds=40)
        await loop.aclose()
        assert loop.totals["place"] >= 8 and loop.totals["errors"] == 0

    asyncio.run(go())
    ledger = pool.trainer.ledger
    # Two batches of two groups of two: admission under eta = 1 admits both at version 0.
    assert ledger.counts() == {"delivered": 8, "failed": 0}
    assert ledger.accepted_twice() == 0
    assert sum(core.counts["finished"] for core in pool.cores.values()) == 8


def test_hosted_workers_observed_as_progress_are_planned_as_they_are(pool: LocalPool) -> None:
    """Through a host, most observations are progress on the states it sent whole; the
    loop sees and plans each worker exactly as it is, and the batch completes once."""
    for w in ("w0", "w1", "w2"):
        pool.add_worker(w)
    pool.host("host0", ["w0", "w1", "w2"])
    answers: list[HostStates] = []
    route = pool.router.handle_async_request

    async def recorded(request: httpx.Request) -> httpx.Response:
        response = await route(request)
        if request.url.path == "/v1/states":
            answers.append(HostStates.model_validate_json(await response.aread()))
        return response

    pool.router.handle_async_request = recorded  # type: ignore[method-assign]
    seen: list[tuple[dict[str, WorkerState], dict[str, WorkerState]]] = []

    async def go() -> None:
        loop = pool.loop(KNOBS, hosted=True)
        loop.on_observe = lambda states: seen.append(
            (dict(states), {w: c.state() for w, c in pool.cores.items()})
        )
        for _ in range(120):
            await loop.cycle()
            observed, actual = seen[-1]
            assert observed == actual
            assert loop.last_plan is not None
            planned = {w.id: w.residents for w in loop.last_plan[0].workers}
            assert planned == {
                w: tuple(Resident(r.id, r.context, r.decoded_since_placement) for r in st.residents)
                for w, st in actual.items()
            }
            await pool.decode(steps=1)  # one step a period: most workers only decode
            if pool.trainer.ledger.counts().get("delivered", 0) == 8:
                break
        await loop.aclose()

    asyncio.run(go())
    assert pool.trainer.ledger.counts() == {"delivered": 8, "failed": 0}
    assert pool.trainer.ledger.accepted_twice() == 0
    assert sum(any(p.decoded) for a in answers for p in a.progress.values()) > 5


def test_a_sample_no_worker_holds_is_requeued_under_a_new_attempt(pool: LocalPool) -> None:
    core = pool.add_worker("w0")

    async def go() -> None:
        loop = pool.loop(KNOBS)
        await loop.cycle()  # admits
        await loop.cycle()  # places
        placed = sorted(core.resident)
        assert placed
        lost = placed[0]
        core.engine.abort(lost)  # the worker forgets it (a crash between two reads)
        del core.resident[lost]
        report = await loop.cycle()
        assert report.requeued == 1
        sample = pool.trainer.ledger.sample(lost)
        assert sample.attempt == 1
        dropped = "SELECT requeues FROM samples WHERE id = ?"  # by a live worker: counted
        assert pool.trainer.ledger.db.execute(dropped, (lost,)).fetchone() == (1,)
        # The next cycles place it again and it completes, once, under that attempt.
        for _ in range(40):
            await pool.decode(steps=4)
            await loop.cycle()
            if pool.trainer.ledger.sample(lost).state == "delivered":
                break
        await loop.aclose()

    asyncio.run(go())
    assert pool.trainer.ledger.accepted_twice() == 0
    assert pool.trainer.ledger.arrivals().get("accepted", 0) >= 1


def test_a_silent_worker_is_declared_lost_after_lost_after_s_and_its_work_moves(
    pool: LocalPool,
) -> None:
    pool.add_worker("w0")
    survivor = pool.add_worker("w1")

    async def go() -> None:
        loop = pool.loop(KNOBS, lost_after_s=5.0)
        await loop.cycle()  # admits
        await loop.cycle()  # places
        on_w0 = {s.id for s in pool.trainer.ledger.samples("placed") if s.worker == "w0"}
        assert on_w0
        pool.router.down.add("w0")
        report = await loop.cycle()
        assert report.lost == [] and report.requeued == 0  # silent, not yet lost
        pool.clock.work(5.0)
        report = await loop.cycle()
        assert report.lost == ["w0"] and report.requeued == len(on_w0)
        charged = pool.trainer.ledger.db.execute("SELECT SUM(requeues) FROM samples").fetchone()
        assert charged == (0,)  # the worker's fault: nothing counts toward MAX_REQUEUES
        for _ in range(40):
            await loop.cycle()
            await pool.decode(steps=4)
            if all(pool.trainer.ledger.sample(s).state == "delivered" for s in on_w0):
                break
        await loop.aclose()
        assert loop.lost == frozenset({"w0"})

    asyncio.run(go())
    ledger = pool.trainer.ledger
    assert ledger.counts() == {"delivered": 8, "failed": 0} and ledger.accepted_twice() == 0
    assert survivor.counts["finished"] == 8


def test_a_lost_worker_that_answers_again_rejoins_and_its_stale_copies_are_fenced(
    pool: LocalPool,
) -> None:
    """A frozen host (SIGSTOP, a long pause) is taken for lost and its samples re-queued;
    when it answers again it is used again, and what it still held under the old
    attempts is dropped there, never delivered or decoded on."""
    paused = pool.add_worker("w0")
    pool.add_worker("w1")

    async def go() -> None:
        loop = pool.loop(KNOBS, lost_after_s=5.0)
        await loop.cycle()  # admits
        await loop.cycle()  # places
        stale = set(paused.resident)
        assert stale
        pool.router.down.add("w0")
        await loop.cycle()
        pool.clock.work(5.0)
        report = await loop.cycle()
        assert report.lost == ["w0"] and report.requeued == len(stale)
        pool.router.down.discard("w0")
        pool.clock.work(loop.config.probe_lost_s)
        await loop.cycle()  # asks w0 again
        await asyncio.sleep(0)
        report = await loop.cycle()  # takes the answer
        assert report.lost == [] and loop.lost == frozenset()
        assert not stale & set(paused.resident), "the old attempts were fenced off"
        assert paused.counts["fenced"] == len(stale)
        assert loop.last_plan is not None
        assert "w0" in {w.id for w in loop.last_plan[0].workers}, "it is planned on again"
        await pool.run_until_delivered(loop, samples=8, rounds=60)
        await loop.aclose()
        assert loop.totals["fenced"] == len(stale)

    asyncio.run(go())
    ledger = pool.trainer.ledger
    assert ledger.counts() == {"delivered": 8, "failed": 0} and ledger.accepted_twice() == 0
    assert paused.counts["finished"] == 0, "nothing it held under an old attempt ended there"


def test_a_worker_that_answers_but_stops_decoding_has_its_work_requeued_then_rejoins(
    pool: LocalPool,
) -> None:
    stuck = pool.add_worker("w0")
    pool.add_worker("w1")

    async def go() -> None:
        loop = pool.loop(KNOBS)
        await loop.cycle()  # admits
        await loop.cycle()  # places
        held = set(stuck.resident)
        assert held
        await pool.decode(steps=2, skip=frozenset({"w0"}))
        pool.clock.work(stuck.stall_bound_s() + 1)
        report = await loop.cycle()
        assert report.lost == ["w0"] and report.requeued == len(held)
        for _ in range(60):
            await loop.cycle()
            await pool.decode(steps=4, skip=frozenset({"w0"}))
            if pool.trainer.ledger.counts().get("delivered", 0) == 8:
                break
        assert pool.trainer.ledger.counts() == {"delivered": 8, "failed": 0}
        # Its engine steps again. A step that decodes nothing is not progress, so step
        # until one does: then it is no longer stalled.
        for _ in range(100):
            await stuck.step()
            if stuck.stalled() is None:
                break
        assert stuck.stalled() is None
        # Probed again once its back-off (up to max_probe_lost_s) has passed, well within
        # the stall bound: then it rejoins and its old copies are fenced.
        rounds = int(loop.config.max_probe_lost_s / loop.config.probe_lost_s) + 2
        assert rounds * loop.config.probe_lost_s < stuck.stall_bound_s()
        for _ in range(rounds):
            pool.clock.work(loop.config.probe_lost_s)
            await loop.cycle()
            await asyncio.sleep(0)
            await loop.cycle()
            if not loop.lost and not stuck.resident:
                break
        await loop.aclose()
        assert loop.lost == frozenset() and stuck.resident == {}, "rejoined, old copies fenced"

    asyncio.run(go())
    assert pool.trainer.ledger.accepted_twice() == 0


def test_a_worker_lost_for_good_is_asked_again_less_and_less_often(pool: LocalPool) -> None:
    pool.add_worker("w0")
    pool.add_worker("w1")

    async def go() -> None:
        loop = pool.loop(KNOBS, lost_after_s=1.0)
        pool.router.down.add("w0")
        await loop.cycle()
        pool.clock.work(1.0)
        await loop.cycle()
        assert loop.lost == frozenset({"w0"})
        asked = 0
        for _ in range(200):  # 100 s
            pool.clock.work(0.5)
            await loop.cycle()
            await pool.decode()  # w1 keeps stepping: it is not stalled
            asked += "w0" in loop._probes
            await asyncio.sleep(0)
        await loop.aclose()
        # 2 + 4 + 8 + 16 + 30 + 30 ... s apart: 7 probes in 100 s, not 50.
        assert 5 <= asked <= 8
        assert loop.lost == frozenset({"w0"})

    asyncio.run(go())


def test_a_placement_the_worker_refuses_goes_back_and_is_placed_later(
    pool: LocalPool, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused placements go back, and the log says so once per worker and cause, not
    once per trajectory (a draining worker refused 40 in one cycle)."""
    pool.add_worker("w0")

    async def go() -> None:
        loop = pool.loop(KNOBS)
        await loop.cycle()  # admits
        pool.router.full.add("w0")
        report = await loop.cycle()
        assert report.actions["place"] > 3 and report.errors == report.actions["place"]
        said = [r.getMessage() for r in caplog.records if "placing" in r.getMessage()]
        assert len(said) == 1 and " on w0 failed: " in said[0]
        assert f"and {report.actions['place'] - 3} more" in said[0]
        # Planned, not applied: the run's counts and its timeline leave them out.
        assert loop.totals["place"] == 0
        assert not any(isinstance(a, Place) for a in loop.last_applied)
        ledger = pool.trainer.ledger
        assert ledger.counts().get("placed", 0) == 0  # every refused sample went back
        assert {s.state for s in ledger.samples()} == {"fresh"}
        pool.router.full.clear()
        report = await loop.cycle()
        assert report.errors == 0 and ledger.counts()["placed"] == report.actions["place"]
        assert loop.totals["place"] == report.actions["place"]
        await loop.aclose()

    asyncio.run(go())


def test_a_worker_that_goes_silent_mid_advance_is_lost_not_waited_for(pool: LocalPool) -> None:
    """An advance runs beside the cycles with a long timeout; a host frozen during one
    was not observed until that timeout. It is observed, lost, and its advance dropped."""
    frozen = pool.add_worker("w0")
    pool.add_worker("w1")
    hang = asyncio.Event()

    async def stuck(_: object) -> None:
        await hang.wait()  # the weights never arrive: the host froze mid-advance

    frozen.advance = stuck  # type: ignore[method-assign,assignment]

    async def go() -> None:
        loop = pool.loop(KNOBS, lost_after_s=5.0)
        for _ in range(80):
            await loop.cycle()
            await pool.decode(steps=4)
            await asyncio.to_thread(pool.trainer.train_next)
            if "w0" in loop._advancing:
                break
        assert "w0" in loop._advancing, "w0 was asked to advance"
        pool.router.down.add("w0")
        await loop.cycle()
        pool.clock.work(5.0)
        report = await loop.cycle()
        assert report.lost == ["w0"] and "w0" not in loop._advancing
        hang.set()
        await loop.aclose()

    asyncio.run(go())


def test_a_worker_whose_pod_is_gone_leaves_and_its_work_is_requeued_at_once(
    pool: LocalPool,
) -> None:
    pool.add_worker("w0")
    pool.add_worker("w1")

    async def go() -> None:
        loop = pool.loop(KNOBS, lost_after_s=60.0)
        await loop.cycle()  # admits
        await loop.cycle()  # places
        on_w0 = {s.id for s in pool.trainer.ledger.samples("placed") if s.worker == "w0"}
        assert on_w0
        pool.router.down.add("w0")  # its pod deleted
        loop.remove_workers(["w0"])
        report = await loop.cycle()  # not after 60 s of silence: now
        assert report.requeued == len(on_w0) and "w0" not in loop.workers
        await pool.run_until_delivered(loop, samples=8, rounds=40)
        await loop.aclose()

    asyncio.run(go())
    ledger = pool.trainer.ledger
    assert ledger.counts() == {"delivered": 8, "failed": 0} and ledger.accepted_twice() == 0


def test_a_worker_recreated_at_a_new_address_joins_afresh_not_after_its_backoff(
    pool: LocalPool,
) -> None:
    pool.add_worker("w0")
    pool.add_worker("w1")

    async def go() -> None:
        loop = pool.loop(KNOBS, lost_after_s=5.0)
        await loop.cycle()
        pool.router.down.add("w0")
        await loop.cycle()
        pool.clock.work(5.0)
        assert (await loop.cycle()).lost == ["w0"]
        pool.cores.pop("w0")
        pool.add_worker("w0-new")  # the pod again, at another address
        loop.add_workers({"w0": "http://w0-new"})
        await loop.cycle()
        assert loop.lost == frozenset()
        assert loop.last_plan is not None
        assert "w0" in {w.id for w in loop.last_plan[0].workers}
        await pool.run_until_delivered(loop, samples=8, rounds=40)
        await loop.aclose()

    asyncio.run(go())
    assert pool.trainer.ledger.counts() == {"delivered": 8, "failed": 0}
