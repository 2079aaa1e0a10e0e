"""The operator's reconciler in one process, on an in-memory Kubernetes API
(`memory_kube.py`): what a pool, a run and a group make, and what a scale moves, read
back from the API after each step, as `kubectl get` would show it."""

from __future__ import annotations

import asyncio

import pytest

from cadence.operator.api.resources import API_VERSION
from cadence.operator.kube.client import path
from cadence.operator.kube.handlers import Events, Invalid, Reconciler
from tests.helpers import example as _example

from .memory_kube import MemoryKube


def _pods(kube: MemoryKube, group: str) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in kube.of_kind("Pod")
        if p["metadata"]["labels"].get("cadence.dev/group") == group
    )


def _bound() -> tuple[MemoryKube, Reconciler, Events]:
    kube, events = MemoryKube(), Events()
    reconciler = Reconciler(kube)
    pool = kube.put(_example("RolloutPool"))
    run = kube.put(_example("TrainingRun"))

    async def go() -> None:
        await reconciler.pool(pool, events)
        await reconciler.run(run, events)

    asyncio.run(go())
    return kube, reconciler, events


def test_a_pool_makes_its_groups_service_and_token_and_a_run_binds_it() -> None:
    kube, _, events = _bound()
    groups = sorted(g["spec"]["group"] for g in kube.of_kind("RolloutGroup"))
    assert groups == ["a910x", "h800"]
    assert len(kube.of_kind("Service")) == 2  # the workers' headless one, the trainer's
    assert [s["metadata"]["name"] for s in kube.of_kind("Secret")] == ["cadence-token"]
    pool = kube.objects[path(API_VERSION, "rolloutpools", "default", "mixed")]
    assert pool["status"]["run"] == "digits"
    assert ("Bound", "RolloutPool mixed") in events
    assert [o["metadata"]["name"] for o in kube.of_kind("StatefulSet")] == ["digits-trainer"]


def test_a_group_makes_its_workers_and_a_scale_out_adds_to_them() -> None:
    kube, reconciler, events = _bound()
    url = path(API_VERSION, "rolloutgroups", "default", "mixed-h800")

    async def go() -> None:
        status = await reconciler.group(kube.objects[url], events)
        assert status["replicas"] == 2
        assert _pods(kube, "h800") == ["mixed-h800-0", "mixed-h800-1"]
        await kube.patch(url, {"spec": {"replicas": 3}})
        status = await reconciler.group(kube.objects[url], events)
        assert status["replicas"] == 3

    asyncio.run(go())
    assert _pods(kube, "h800") == ["mixed-h800-0", "mixed-h800-1", "mixed-h800-2"]
    pod = kube.objects[path("v1", "pods", "default", "mixed-h800-2")]
    assert pod["metadata"]["labels"]["cadence.dev/run"] == "digits"


def test_a_released_pool_retires_its_workers() -> None:
    kube, reconciler, events = _bound()
    url = path(API_VERSION, "rolloutgroups", "default", "mixed-a910x")

    async def go() -> None:
        await reconciler.group(kube.objects[url], events)
        assert len(_pods(kube, "a910x")) == 2
        await kube.delete(path(API_VERSION, "trainingruns", "default", "digits"))
        await reconciler.pool(
            kube.objects[path(API_VERSION, "rolloutpools", "default", "mixed")], events
        )
        status = await reconciler.group(kube.objects[url], events)
        assert status["replicas"] == 0

    asyncio.run(go())
    assert _pods(kube, "a910x") == []
    assert ("Released", "RolloutPool mixed") in events


def test_an_invalid_pool_is_refused_with_the_field_named() -> None:
    kube = MemoryKube()
    bad = _example("RolloutPool")
    bad["spec"]["groups"][0]["replicas"] = -1
    with pytest.raises(Invalid, match="replicas"):
        asyncio.run(Reconciler(kube).pool(kube.put(bad), []))
    assert kube.of_kind("RolloutGroup") == []
