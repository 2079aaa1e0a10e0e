"""What the operator asks of the API server does not grow with a pool's pods, on the
fake cluster (`fake_cluster.py`): its pods are listed, never read one by one (a GET
before each create was a GET per worker), and a resync with nothing changing costs the
same requests for 16 pods as for 64. `cadence bench operator` measures the same at
1,024 pods."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import kmock
import pytest

from cadence.devcluster.emulator import KubernetesEmulator

from .fake_cluster import RESYNC_S, on_fake_time, operating
from .harness import NS, PODS

pytestmark = pytest.mark.timeout(120)

OPERATOR_AGENTS = ("cadence-operator", "kopf/")


@attrs.define(kw_only=True)
class NamingEmulator(KubernetesEmulator):
    """The emulator, its audit log with the name of each request's object (None for
    lists, watches and creates)."""

    names: list[str | None] = attrs.field(factory=list, init=False)

    def _record(self, request: kmock.Request) -> None:
        before = len(self.audit)
        super()._record(request)
        if len(self.audit) > before:
            self.names.append(request.name)

    def operator_requests(self, since: int = 0) -> list[tuple[str, str, str | None]]:
        """(verb, resource, name) of the operator's requests from `since` on."""
        return [
            (verb, resource, name)
            for (agent, verb, _, resource), name in zip(
                self.audit[since:], self.names[since:], strict=True
            )
            if agent.startswith(OPERATOR_AGENTS)
        ]


def _pool(pods: int) -> dict[str, Any]:
    return {
        "apiVersion": "cadence.dev/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": "load"},
        "spec": {
            "groups": [
                {
                    "name": name,
                    "accelerator": "H800",
                    "replicas": pods // 2,
                    "maxReplicas": 64,
                    "resources": {"nvidia.com/gpu": "1"},
                }
                for name in ("a", "b")
            ]
        },
    }


RUN = {
    "apiVersion": "cadence.dev/v1alpha1",
    "kind": "TrainingRun",
    "metadata": {"name": "load"},
    "spec": {
        "pool": "load",
        "model": {"catalog": "Qwen3-8B"},
        "dataset": {"task": "digits"},
        "batch": {"promptsPerBatch": 8, "samplesPerPrompt": 8, "maxTokens": 12},
    },
}
READY = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


async def _load(pods: int) -> tuple[list[tuple[str, str, str | None]], int]:
    """The operator's requests while a pool of `pods` workers is made and comes Ready
    (each pod marked Ready as the kubelet stand-in marks it), and its requests over two
    resyncs with nothing changing."""
    kube = NamingEmulator()
    async with operating(kube) as c:
        await c.call("POST", f"{NS}/rolloutpools", _pool(pods))
        await c.call("POST", f"{NS}/trainingruns", RUN)

        async def all_made() -> bool:
            return len(await c.pods()) == pods

        await c.until(all_made, f"{pods} worker pods")
        for pod in await c.pods():
            await c.call("PATCH", f"{PODS}/{pod['metadata']['name']}/status", READY)

        async def all_ready() -> bool:
            return (await c.status(f"{NS}/rolloutpools/load")).get("ready") == f"{pods}/{pods}"

        await c.until(all_ready, f"the pool's {pods} pods Ready")
        making = kube.operator_requests()
        # A period to settle, and half of one: the pool's status (what `all_ready` read)
        # is written in a resync, so the counted periods start half-way between two.
        await asyncio.sleep(1.5 * RESYNC_S)
        mark = len(kube.audit)
        await asyncio.sleep(2 * RESYNC_S)
        steady = len(kube.operator_requests(mark))
    return making, steady


@on_fake_time
async def test_a_pools_pods_are_listed_not_read_one_by_one_and_a_resync_costs_the_same() -> None:
    small_making, small_steady = await _load(16)
    large_making, large_steady = await _load(64)
    for making in (small_making, large_making):
        read = [
            name or "" for verb, resource, name in making if (verb, resource) == ("get", "pods")
        ]
        workers = [name for name in read if name.startswith(("load-a-", "load-b-"))]
        assert workers == [], f"worker pods read one by one: {workers}"
    assert sum(r[:2] == ("create", "pods") for r in large_making) == 64
    assert small_steady > 0
    assert large_steady == small_steady
