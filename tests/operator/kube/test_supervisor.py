"""The supervisor (`operator/kube/supervisor.py`): what the watch delivered is reconciled
again each turn and its status written; each run has one control loop while it exists,
which a DELETED event stops, and a loop that returned is started again."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf

from cadence.operator.kube.supervisor import Key, Stopped, Supervisor
from tests.helpers import example

from .memory_kube import MemoryKube


class Calls:
    """A reconcile that writes how often it ran, and a control loop that runs until told."""

    def __init__(self) -> None:
        self.reconciled: list[Key] = []
        self.started: list[str] = []
        self.ended: list[str] = []
        self.returns = False  # a loop with nothing to do returns at once

    async def reconcile(self, key: Key, body: Mapping[str, Any], patch: kopf.Patch) -> None:
        self.reconciled.append(key)
        patch.status["seen"] = self.reconciled.count(key)

    async def control(self, body: dict[str, Any], stopped: Stopped) -> None:
        self.started.append(body["metadata"]["name"])
        try:
            while not self.returns and not stopped:
                await asyncio.sleep(0)
        finally:
            self.ended.append(body["metadata"]["name"])


def _supervisor() -> tuple[Supervisor, Calls, MemoryKube]:
    calls, kube = Calls(), MemoryKube()
    return Supervisor(kube, calls.reconcile, calls.control), calls, kube


async def _until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0)


def test_each_turn_reconciles_what_the_watch_saw_and_writes_its_status() -> None:
    supervisor, calls, kube = _supervisor()
    forgotten: list[Key] = []
    supervisor.forget = forgotten.append
    pool = kube.put(example("RolloutPool"))

    async def go() -> None:
        supervisor.saw("rolloutpools", None, pool)
        await supervisor.turn()
        await supervisor.turn()
        stored = await kube.get("/apis/cadence.dev/v1alpha1/namespaces/default/rolloutpools/mixed")
        assert stored is not None and stored["status"]["seen"] == 2
        supervisor.saw("rolloutpools", "DELETED", pool)
        await supervisor.turn()
        assert forgotten == [("rolloutpools", "default", "mixed")]  # nothing kept of it

    asyncio.run(go())
    assert calls.reconciled == [("rolloutpools", "default", "mixed")] * 2
    assert calls.started == []  # only runs have loops


def test_a_run_has_one_loop_which_its_deletion_stops() -> None:
    supervisor, calls, kube = _supervisor()
    run = kube.put(example("TrainingRun"))

    async def go() -> None:
        supervisor.saw("trainingruns", None, run)
        await supervisor.turn()
        await supervisor.turn()  # the loop is running: not started twice
        await _until(lambda: calls.started)
        changed = {**run, "status": {"phase": "Running"}}
        supervisor.saw("trainingruns", "MODIFIED", changed)
        held = supervisor.seen[("trainingruns", "default", "digits")]
        assert held["status"]["phase"] == "Running"  # the loop's body is the live one
        supervisor.saw("trainingruns", "DELETED", run)
        await _until(lambda: calls.ended)
        await supervisor.aclose()

    asyncio.run(go())
    assert calls.started == ["digits"] and calls.ended == ["digits"]


def test_a_loop_that_returned_is_started_again_while_its_run_exists() -> None:
    supervisor, calls, kube = _supervisor()
    calls.returns = True

    async def go() -> None:
        supervisor.saw("trainingruns", None, kube.put(example("TrainingRun")))
        await supervisor.turn()
        await _until(lambda: calls.ended)
        await supervisor.turn()
        await _until(lambda: len(calls.ended) == 2)
        await supervisor.aclose()

    asyncio.run(go())
    assert calls.started == ["digits", "digits"]


def test_a_loop_that_ignores_its_stop_is_cancelled() -> None:
    supervisor, _, kube = _supervisor()
    supervisor.stop_timeout_s = 0.01
    cancelled = []

    async def deaf(body: dict[str, Any], stopped: Stopped) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(body["metadata"]["name"])
            raise

    supervisor.control = deaf

    async def go() -> None:
        supervisor.saw("trainingruns", None, kube.put(example("TrainingRun")))
        await supervisor.turn()
        await asyncio.sleep(0)
        await supervisor.aclose()

    asyncio.run(go())
    assert cancelled == ["digits"]


def test_a_changed_run_gets_a_new_loop_after_the_old_one_ends() -> None:
    """A scheduler knob changed on a live run reaches its loop: the old loop is stopped,
    and only once it has ended does the next turn start one with the new spec."""
    supervisor, calls, kube = _supervisor()
    run = kube.put(example("TrainingRun"))
    seen: list[object] = []

    async def control(body: dict[str, Any], stopped: Stopped) -> None:
        seen.append(body["spec"]["scheduler"]["hMin"])
        await calls.control(body, stopped)

    supervisor.control = control

    async def go() -> None:
        supervisor.saw("trainingruns", None, run)
        await supervisor.turn()
        await _until(lambda: calls.started)
        changed = {**run, "metadata": {**run["metadata"], "generation": 2}}
        changed["spec"] = {**run["spec"], "scheduler": {**run["spec"]["scheduler"], "hMin": 512}}
        supervisor.saw("trainingruns", "MODIFIED", changed)
        await supervisor.turn()  # asks the old loop to stop
        await _until(lambda: calls.ended)
        await _until(lambda: not supervisor.stopping)
        await supervisor.turn()  # starts the new one
        await _until(lambda: len(calls.started) == 2)
        await supervisor.aclose()

    asyncio.run(go())
    assert seen == ["auto", 512] and len(calls.started) == 2
