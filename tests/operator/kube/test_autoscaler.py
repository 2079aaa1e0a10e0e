"""The operator's autoscaler on the in-memory Kubernetes API: a pool short of KV has the
group that buys the most scaled through its /scale, every decision is in the pool's
status and said in an Event, the budget holds, and exportOnly writes no /scale."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from cadence.operator.api.group import groups_of
from cadence.operator.api.resources import RolloutPool
from cadence.operator.kube.autoscaler import Autoscaler, Seen
from cadence.scheduler.autoscale import GroupShape
from cadence.scheduler.snapshot import FreshSample
from tests.operator.kube.memory_kube import MemoryKube
from tests.scheduler.factories import make_snapshot, make_worker

EXAMPLE = Path(__file__).parents[3] / "manifests" / "examples" / "longtail.yaml"
NS = "/apis/cadence.dev/v1alpha1/namespaces/default"
CAP = 3_000


def _pool(**autoscaling: Any) -> dict[str, Any]:
    pool: dict[str, Any] = next(
        d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "RolloutPool"
    )
    pool["metadata"]["namespace"] = "default"
    pool["spec"]["autoscaling"] = {"enabled": True, "periodS": 30, **autoscaling}
    for g in pool["spec"]["groups"]:
        g["maxReplicas"] = 6
    return pool


def _cluster(pool_body: dict[str, Any]) -> tuple[MemoryKube, RolloutPool]:
    kube = MemoryKube()
    kube.put(pool_body)
    pool = RolloutPool.model_validate(pool_body)
    for g in groups_of(pool):
        kube.put(g.model_dump(by_alias=True, exclude_none=True, mode="json"))
    return kube, pool


def _seen(decoded: dict[str, int], fresh: int) -> Seen:
    """Two workers a group, their KV full; `fresh` samples no worker took."""
    workers, members = [], {}
    for group in ("h800", "a910x"):
        for i in range(2):
            wid = f"mixed-{group}-{i}"
            workers.append(make_worker(wid, capacity=CAP, residents=[1_000, 1_000, 900]))
            members[wid] = f"mixed-{group}"
    snapshot = make_snapshot(
        workers,
        fresh=[FreshSample(f"f{i}", 9, 28) for i in range(fresh)],
        admitted=10,
        total_groups=40,
        batch_size=8,
    )
    shapes = [GroupShape("mixed-h800", 2, CAP), GroupShape("mixed-a910x", 1, CAP)]
    return Seen((snapshot, ()), shapes, members, decoded)


def _run(pool_body: dict[str, Any], readings: int = 4) -> tuple[MemoryKube, list[tuple[str, str]]]:
    kube, pool = _cluster(pool_body)
    now = [0.0]
    events: list[tuple[str, str]] = []
    scaler = Autoscaler(
        kube, lambda body, reason, msg, warn: events.append((reason, msg)), lambda: now[0]
    )

    async def go() -> None:
        for k in range(readings):
            # Each worker decodes 100 tok/s: the a910x ones buy more per dollar (1.2/h).
            tokens = int(100 * 30 * k)
            seen = _seen({w: tokens for w in _seen({}, 0).members}, fresh=64)
            await scaler.step(pool, pool_body, seen)
            now[0] += 30.0

    asyncio.run(go())
    return kube, events


def test_a_pool_short_of_kv_scales_the_group_that_buys_the_most_through_scale() -> None:
    kube, events = _run(_pool(budgetPerHour=20.0))
    assert kube.scaled and {url for url, _ in kube.scaled} == {f"{NS}/rolloutgroups/mixed-a910x"}
    group = kube.objects[f"{NS}/rolloutgroups/mixed-a910x"]
    assert group["spec"]["replicas"] > 2
    message = next(msg for reason, msg in events if reason == "AutoscaledOut")
    assert message.startswith("mixed-a910x: 2 -> ") and "buys the most tok/$" in message
    status = kube.objects[f"{NS}/rolloutpools/mixed"]["status"]["autoscaling"]
    assert status["budgetPerHour"] == 20.0 and status["costPerHour"] <= 20.0
    assert {g["name"] for g in status["groups"]} == {"mixed-h800", "mixed-a910x"}
    assert all(g["reason"] for g in status["groups"])


def test_the_budget_holds_a_scale_out_it_cannot_pay_for() -> None:
    kube, events = _run(_pool(budgetPerHour=6.4))  # 2 x 2.0 + 2 x 1.2: the pool as it is
    assert kube.scaled == [] and not [e for e in events if e[0] == "AutoscaledOut"]
    status = kube.objects[f"{NS}/rolloutpools/mixed"]["status"]["autoscaling"]
    a910x = next(g for g in status["groups"] if g["name"] == "mixed-a910x")
    assert "held by the budget (6.4/h)" in a910x["reason"]
    assert status["costPerHour"] <= 6.4


def test_export_only_computes_targets_but_writes_no_scale() -> None:
    kube, _ = _run(_pool(budgetPerHour=20.0, exportOnly=True))
    assert kube.scaled == []
    status = kube.objects[f"{NS}/rolloutpools/mixed"]["status"]["autoscaling"]
    a910x = next(g for g in status["groups"] if g["name"] == "mixed-a910x")
    assert a910x["replicas"] > 2  # the target, for an HPA or KEDA to act on
    assert kube.objects[f"{NS}/rolloutgroups/mixed-a910x"]["spec"]["replicas"] == 2
