"""Which pods a run's control loop polls: members by readiness, identity and presence."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from cadence.operator.api.files import load
from cadence.operator.api.resources import API_VERSION
from cadence.operator.control.config import LoopConfig
from cadence.operator.control.loop import ControlLoop
from cadence.operator.kube.reconciling import pod_endpoint
from cadence.operator.kube.run_report import RunReporter
from cadence.scheduler.cadence import CadencePolicy
from cadence.scheduler.snapshot import Knobs
from cadence.trainer.client import TrainerClient
from tests.helpers import TRAINING_RUN
from tests.operator.kube.memory_kube import MemoryKube
from tests.scheduler.factories import make_snapshot


def _pod(name: str, uid: str, ip: str | None, ready: bool) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": str(ready)}]}
    if ip is not None:
        status["podIP"] = ip
    return {"metadata": {"name": name, "uid": uid, "labels": {}}, "spec": {}, "status": status}


def _reporter(
    kube: MemoryKube | None, trainer: TrainerClient, clock: Any = time.monotonic
) -> RunReporter:
    """The example run's reporter, over a loop with no worker yet."""
    pool, run = load(TRAINING_RUN)
    knobs = Knobs(h_min=256, delta=16, eta=1)
    loop = ControlLoop(CadencePolicy(), LoopConfig(knobs=knobs), trainer, {}, "t")
    return RunReporter(
        kube=kube,  # type: ignore[arg-type]
        endpoint=pod_endpoint,
        status_every_s=1.0,
        run=run,
        pool=pool,
        body={},
        loop=loop,
        trainer=trainer,
        post=lambda *_: None,
        clock=clock,
    )


def test_pods_join_when_ready_join_afresh_when_recreated_and_leave_when_gone() -> None:
    trainer = TrainerClient("http://127.0.0.1:9", "t")  # never called here

    async def go() -> None:
        reporter = _reporter(None, trainer)
        loop = reporter.loop
        loading = _pod("mixed-h800-1", "u1", "10.0.0.2", ready=False)  # model still loading
        reporter._members(
            [_pod("mixed-h800-0", "u0", "10.0.0.1", True), loading, _pod("x", "u", None, True)]
        )
        assert loop.workers == {"mixed-h800-0": "http://10.0.0.1:8000"}
        loop._lost.add("mixed-h800-0")  # taken for lost, then its pod was recreated
        reporter._members(
            [
                _pod("mixed-h800-0", "u0-again", "10.0.0.1", True),
                _pod("mixed-h800-1", "u1", "10.0.0.2", True),
            ]
        )
        assert set(loop.workers) == {"mixed-h800-0", "mixed-h800-1"}
        assert loop.lost == frozenset(), "the new pod is not the lost one"
        reporter._members([_pod("mixed-h800-1", "u1", "10.0.0.2", False)])  # h800-0 deleted
        assert set(loop.workers) == {"mixed-h800-1"}, "an unready pod stays; a gone one leaves"
        await loop.aclose()
        await trainer.aclose()

    asyncio.run(go())


def _pool_body(groups: list[dict[str, Any]]) -> dict[str, Any]:
    pool, _ = load(TRAINING_RUN)
    body = pool.model_dump(mode="json", by_alias=True, exclude_none=True)
    body["metadata"]["uid"] = "server-set"  # what the API server adds is ignored
    body["spec"]["groups"] = groups
    return body


def _reported_after(change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> set[str]:
    """The groups reported once the pool's groups are changed mid-run by `change`."""
    trainer = TrainerClient("http://127.0.0.1:9", "t")  # never called here
    kube = MemoryKube()
    for group in ("mixed-h800", "mixed-a910x", "mixed-l40s"):
        kube.put({"apiVersion": API_VERSION, "kind": "RolloutGroup", "metadata": {"name": group}})

    async def go() -> set[str]:
        reporter = _reporter(kube, trainer)
        loop = reporter.loop
        loop.last_plan = (make_snapshot([]), ())
        written = reporter.pool.model_dump(mode="json", by_alias=True, exclude_none=True)
        groups = change(written["spec"]["groups"])
        reporter._follow(_pool_body(groups))
        await reporter._groups([], _pool_body(groups))
        await loop.aclose()
        await trainer.aclose()
        return set(reporter.series.groups)

    return asyncio.run(go())


def test_a_group_removed_from_the_pool_mid_run_stops_being_reported() -> None:
    assert _reported_after(lambda groups: groups[:1]) == {"mixed-h800"}


def test_a_group_added_to_the_pool_mid_run_is_reported() -> None:
    """The run's group figures were built once, when its loop started: a group added
    later had no status figures and no metrics until the operator restarted."""
    added = {"name": "l40s", "accelerator": "L40S", "affinity": 1, "replicas": 1}
    assert _reported_after(lambda groups: [*groups, added]) == {
        "mixed-h800",
        "mixed-a910x",
        "mixed-l40s",
    }


def test_a_pool_spec_the_models_refuse_leaves_the_reported_groups_as_they_were() -> None:
    assert _reported_after(lambda groups: [{**groups[0], "replicas": -3}]) == {
        "mixed-h800",
        "mixed-a910x",
    }


class _CountingKube:
    """An API server with no pool: every read counted."""

    def __init__(self) -> None:
        self.reads = 0

    async def get(self, url: str) -> None:
        self.reads += 1

    async def list(self, url: str, selector: Any = None) -> list[Any]:
        self.reads += 1
        return []


def test_a_runs_status_is_read_and_written_at_most_once_a_period_on_its_clock() -> None:
    trainer = TrainerClient("http://127.0.0.1:9", "t")  # never called: no pool
    now = [100.0]
    kube = _CountingKube()
    reporter = _reporter(None, trainer, clock=lambda: now[0])
    reporter.kube = kube  # type: ignore[assignment]

    async def go() -> None:
        assert await reporter.done()  # its pool is gone: the loop ends
        assert kube.reads == 2
        now[0] += 0.5  # within status_every_s (1 s): nothing read
        assert not await reporter.done()
        assert kube.reads == 2
        now[0] += 0.6
        assert await reporter.done()
        assert kube.reads == 4
        await trainer.aclose()

    asyncio.run(go())
