"""The operator's reconciler in one process, on an in-memory Kubernetes API
(`memory_kube.py`): what a pool, a run and a group make, and what a scale moves, read
back from the API after each step, as `kubectl get` would show it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf
import pytest

from cadence.operator.api.resources import API_VERSION
from cadence.operator.kube.client import KubeError, path
from cadence.operator.kube.handlers import Handling, Reconciler
from cadence.operator.kube.reconciling import Events, Invalid, Status
from cadence.operator.kube.supervisor import Stopped
from cadence.trainer.app import create_app as trainer_app
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer
from tests.helpers import example
from tests.operator.control.harness import Router

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
    pool = kube.put(example("RolloutPool"))
    run = kube.put(example("TrainingRun"))

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
    bad = example("RolloutPool")
    bad["spec"]["groups"][0]["replicas"] = -1
    with pytest.raises(Invalid, match="replicas"):
        asyncio.run(Reconciler(kube).pool(kube.put(bad), []))
    assert kube.of_kind("RolloutGroup") == []


def test_an_autoscaling_budget_below_the_pools_cost_is_invalid_before_any_group() -> None:
    kube = MemoryKube()
    poor = example("RolloutPool")  # two H800 at 2.0 and two A910X at 1.2: 6.4 an hour
    poor["spec"]["autoscaling"] = {"enabled": True, "budgetPerHour": 5.0}
    handling, said = Handling(Reconciler(kube)), _Said()
    handling.post = said
    patch = asyncio.run(_handle(handling, "rolloutpools", kube.put(poor)))
    assert _conditions(patch)["Degraded"] == ("True", "Invalid")
    assert "budgetPerHour: 5 is below the pool's starting cost of 6.4" in said.events[0][1]
    assert kube.of_kind("RolloutGroup") == []


class _Said:
    """The Events a handler posted: (reason, message, warning)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []

    def __call__(self, body: object, reason: str, message: str, warning: bool) -> None:
        self.events.append((reason, message, warning))


def _conditions(patch: kopf.Patch) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in patch.status["conditions"]}


async def _handle(handling: Handling, kind: str, body: Mapping[str, Any]) -> kopf.Patch:
    reconciler = handling.reconciler
    call = {"rolloutpools": reconciler.pool, "rolloutgroups": reconciler.group}[kind]
    patch = kopf.Patch()
    await handling.handler(kind, call)(body=body, patch=patch)
    return patch


def test_a_groups_degraded_clears_once_its_spec_is_valid_again() -> None:
    kube, reconciler, _ = _bound()
    handling, said = Handling(reconciler), _Said()
    handling.post = said
    url = path(API_VERSION, "rolloutgroups", "default", "mixed-h800")

    async def go() -> None:
        bad = await kube.patch(url, {"spec": {"replicas": 20, "maxReplicas": 16}})
        patch = await _handle(handling, "rolloutgroups", bad)
        assert _conditions(patch)["Degraded"] == ("True", "Invalid")
        bad = await kube.patch(url, {"status": patch.status})
        good = await kube.patch(url, {"spec": {"replicas": 6}})
        patch = await _handle(handling, "rolloutgroups", good)
        assert _conditions(patch)["Degraded"] == ("False", "Valid")
        generation = good["metadata"]["generation"]
        assert {c["observedGeneration"] for c in patch.status["conditions"]} == {generation}
        assert all(c["message"] for c in patch.status["conditions"])
        assert patch.status["replicas"] == 6

    asyncio.run(go())
    assert [e[0] for e in said.events] == ["Invalid"]


def test_a_reconcile_that_fails_is_degraded_with_one_event_not_retried_in_silence() -> None:
    kube = MemoryKube()
    pool = kube.put(example("RolloutPool"))

    async def refuse(obj: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        raise KubeError(403, "rolloutgroups is forbidden")

    kube.ensure = refuse  # type: ignore[method-assign]
    handling, said = Handling(Reconciler(kube)), _Said()
    handling.post = said

    async def go() -> list[kopf.Patch]:
        return [await _handle(handling, "rolloutpools", pool) for _ in range(3)]

    patches = asyncio.run(go())
    degraded = [p.status["conditions"] for p in patches]
    assert all(
        any(c["type"] == "Degraded" and c["reason"] == "ReconcileError" for c in cs)
        for cs in degraded
    )
    assert len(said.events) == 1 and said.events[0][2]  # one warning, not one per retry
    assert "403: rolloutgroups is forbidden" in said.events[0][1]


def test_a_pool_whose_names_make_a_pod_name_too_long_is_invalid_not_retried() -> None:
    kube = MemoryKube()
    long = example("RolloutPool")
    long["metadata"]["name"] = "a-pool-name-that-is-long-enough-to-overflow-a-pod"
    long["spec"]["groups"][0]["name"] = "h800-group-x"
    handling, said = Handling(Reconciler(kube)), _Said()
    handling.post = said
    patch = asyncio.run(_handle(handling, "rolloutpools", kube.put(long)))
    assert _conditions(patch)["Degraded"] == ("True", "Invalid")
    assert said.events[0][0] == "Invalid" and "at most 56" in said.events[0][1]
    assert kube.of_kind("RolloutGroup") == []


def test_a_run_is_ready_only_once_its_trainer_answers_and_every_group_has_a_worker(
    tiny_model: Path, tmp_path: Path
) -> None:
    kube, reconciler, _ = _bound()
    router = Router()
    reconciler.transport = router
    reconciler.trainer_endpoint = lambda run, pool: "http://trainer"
    run_url = path(API_VERSION, "trainingruns", "default", "digits")
    trainer = Trainer(TrainerConfig(model_path=tiny_model, state_dir=tmp_path))

    def ready(status: dict[str, Any]) -> tuple[str, str]:
        (c,) = [c for c in status["conditions"] if c["type"] == "Ready"]
        return c["status"], c["message"]

    async def go() -> None:
        status = await reconciler.run(kube.objects[run_url], [])
        assert status["phase"] == "Starting"
        assert ready(status) == (
            "False",
            "the trainer does not answer yet; group a910x has no ready worker; "
            "group h800 has no ready worker",
        )
        token = await reconciler._token("default", "cadence-token")
        assert token is not None
        router.add("trainer", trainer_app(trainer, token, train=False))
        h800 = path(API_VERSION, "rolloutgroups", "default", "mixed-h800")
        await kube.patch(h800 + "/status", {"status": {"readyReplicas": 1}})
        status = await reconciler.run(kube.objects[run_url], [])
        assert ready(status) == ("False", "group a910x has no ready worker")
        a910x = path(API_VERSION, "rolloutgroups", "default", "mixed-a910x")
        await kube.patch(a910x + "/status", {"status": {"readyReplicas": 2}})
        status = await reconciler.run(kube.objects[run_url], [])
        assert ready(status)[0] == "True"

    try:
        asyncio.run(go())
    finally:
        trainer.ledger.close()


def _mark_ready(kube: MemoryKube) -> None:
    for pod in kube.of_kind("Pod"):
        pod["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}


def test_a_group_removed_from_its_pool_goes() -> None:
    kube, reconciler, events = _bound()
    pool_url = path(API_VERSION, "rolloutpools", "default", "mixed")

    async def go() -> None:
        pool = kube.objects[pool_url]
        pool = await kube.patch(pool_url, {"spec": {"groups": pool["spec"]["groups"][:1]}})
        await reconciler.pool(pool, events)

    asyncio.run(go())
    assert [g["spec"]["group"] for g in kube.of_kind("RolloutGroup")] == ["h800"]
    assert ("Removed", "RolloutGroup mixed-a910x: no longer in the pool") in events


def test_a_pool_in_any_namespace_gets_its_workers_policy_which_follows_its_groups() -> None:
    """The workers' NetworkPolicy is the operator's, in the pool's namespace, admitting the
    operator from its own; a group turned to vLLM opens the KV ports on the next pass."""
    kube, events = MemoryKube(), Events()
    reconciler = Reconciler(kube, operator_namespace="platform")
    body = example("RolloutPool")
    body["metadata"]["namespace"] = "rl-team"
    for group in body["spec"]["groups"]:
        group["engine"] = {**group.get("engine", {}), "backend": "emulated"}
    pool = kube.put(body)
    url = path(API_VERSION, "rolloutpools", "rl-team", "mixed")
    policy_url = path("networking.k8s.io/v1", "networkpolicies", "rl-team", "mixed-workers")

    async def go() -> None:
        await reconciler.pool(pool, events)
        policy = kube.objects[policy_url]
        operator = policy["spec"]["ingress"][0]["from"][0]
        assert operator["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": "platform"
        }
        assert len(policy["spec"]["ingress"]) == 2  # control and scrapes: no KV rule
        groups = kube.objects[url]["spec"]["groups"]
        groups[0]["engine"]["backend"] = "vllm"
        await reconciler.pool(await kube.patch(url, {"spec": {"groups": groups}}), events)

    asyncio.run(go())
    ports = [r["ports"][0]["port"] for r in kube.objects[policy_url]["spec"]["ingress"]]
    assert ports == [8000, 8000, 5600]


def test_a_pool_edit_reaches_its_group_and_rolls_its_pods_one_at_a_time() -> None:
    kube, reconciler, events = _bound()
    pool_url = path(API_VERSION, "rolloutpools", "default", "mixed")
    url = path(API_VERSION, "rolloutgroups", "default", "mixed-h800")

    def selectors() -> dict[str, dict[str, str]]:
        return {
            p["metadata"]["name"]: p["spec"].get("nodeSelector", {})
            for p in kube.of_kind("Pod")
            if p["metadata"]["labels"]["cadence.dev/group"] == "h800"
        }

    async def go() -> None:
        await kube.patch(url, {"spec": {"replicas": 3}})  # scaled since, by HPA
        await reconciler.group(kube.objects[url], events)
        _mark_ready(kube)
        groups = kube.objects[pool_url]["spec"]["groups"]
        groups[0]["nodeSelector"] = {"pool.example/zone": "b"}
        await reconciler.pool(await kube.patch(pool_url, {"spec": {"groups": groups}}), events)
        spec = kube.objects[url]["spec"]
        assert spec["nodeSelector"] == {"pool.example/zone": "b"} and spec["replicas"] == 3
        zone_b = {"pool.example/zone": "b"}
        for turn in range(3):
            await reconciler.group(kube.objects[url], events)  # one stale pod goes
            assert len(selectors()) == 2
            await reconciler.group(kube.objects[url], events)  # its replacement comes
            assert list(selectors().values()).count(zone_b) == turn + 1
            _mark_ready(kube)
        await reconciler.group(kube.objects[url], events)  # nothing stale: nothing moves

    asyncio.run(go())
    assert len(selectors()) == 3
    assert sum(e[0] == "Replaced" for e in events) == 3
    assert any(e[0] == "Updated" and "nodeSelector" in e[1] for e in events)


def test_stale_pods_that_never_became_ready_are_replaced_without_waiting() -> None:
    # A template that kept every pod from serving, then fixed: waiting for the others to
    # be ready before replacing one would wait for ever.
    kube, reconciler, events = _bound()
    pool_url = path(API_VERSION, "rolloutpools", "default", "mixed")
    url = path(API_VERSION, "rolloutgroups", "default", "mixed-h800")
    zone_b = {"pool.example/zone": "b"}

    def selectors() -> list[dict[str, str]]:
        return [
            p["spec"].get("nodeSelector", {})
            for p in kube.of_kind("Pod")
            if p["metadata"]["labels"]["cadence.dev/group"] == "h800"
        ]

    async def go() -> None:
        await reconciler.group(kube.objects[url], events)  # two pods, neither ever ready
        groups = kube.objects[pool_url]["spec"]["groups"]
        groups[0]["nodeSelector"] = zone_b
        await reconciler.pool(await kube.patch(pool_url, {"spec": {"groups": groups}}), events)
        for _ in range(4):
            await reconciler.group(kube.objects[url], events)

    asyncio.run(go())
    assert selectors() == [zone_b, zone_b]
    assert sum(e[0] == "Replaced" for e in events) == 2


def test_a_token_secret_without_its_key_is_said_in_one_sentence() -> None:
    kube, reconciler, events = _bound()
    secret_url = path("v1", "secrets", "default", "cadence-token")
    secret = kube.objects[secret_url]
    secret["data"] = {"something-else": "eA=="}  # made by hand, under another key
    run = kube.objects[path(API_VERSION, "trainingruns", "default", "digits")]
    with pytest.raises(
        Invalid, match="Secret cadence-token holds no bearer token under the key 'token'"
    ):
        asyncio.run(reconciler.run(run, events))


def test_a_run_waiting_on_a_bad_secret_logs_why_once_not_at_every_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The supervisor retries a run's loop every few seconds: one bad Secret filled the
    operator's log with the same lines."""
    kube, reconciler, _ = _bound()
    kube.objects[path("v1", "secrets", "default", "cadence-token")]["data"] = {"x": "eA=="}
    run = kube.objects[path(API_VERSION, "trainingruns", "default", "digits")]

    async def retries() -> None:
        for _ in range(3):
            await reconciler.control(run, Stopped())

    with caplog.at_level(logging.WARNING, logger="cadence.operator"):
        asyncio.run(retries())
    said = [r for r in caplog.records if "holds no bearer token" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is None  # one line, no traceback


def test_lowering_max_replicas_below_a_groups_count_brings_the_count_within_it() -> None:
    kube, reconciler, events = _bound()
    pool_url = path(API_VERSION, "rolloutpools", "default", "mixed")
    url = path(API_VERSION, "rolloutgroups", "default", "mixed-h800")

    async def go() -> Status:
        await kube.patch(url, {"spec": {"replicas": 5}})  # an autoscaler's
        groups = kube.objects[pool_url]["spec"]["groups"]
        groups[0]["maxReplicas"] = 3
        return await reconciler.pool(
            await kube.patch(pool_url, {"spec": {"groups": groups}}), events
        )

    status = asyncio.run(go())
    spec = kube.objects[url]["spec"]
    assert (spec["replicas"], spec["maxReplicas"]) == (3, 3)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False"


def test_a_group_the_api_server_refuses_does_not_hold_up_the_pools_others() -> None:
    kube, reconciler, events = _bound()
    pool_url = path(API_VERSION, "rolloutpools", "default", "mixed")
    refused_url = path(API_VERSION, "rolloutgroups", "default", "mixed-h800")
    patch = kube.patch

    async def refusing(url: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if url == refused_url:
            raise KubeError(422, "spec.replicas: Invalid value: 9: must be <= 4")
        return await patch(url, body)

    kube.patch = refusing  # type: ignore[method-assign]

    async def go() -> Status:
        groups = kube.objects[pool_url]["spec"]["groups"]
        for g in groups:
            g["nodeSelector"] = {"pool.example/zone": "b"}
        return await reconciler.pool(await patch(pool_url, {"spec": {"groups": groups}}), events)

    status = asyncio.run(go())
    other = kube.objects[path(API_VERSION, "rolloutgroups", "default", "mixed-a910x")]
    assert other["spec"]["nodeSelector"] == {"pool.example/zone": "b"}
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True"
    assert degraded["message"] == (
        "RolloutGroup mixed-h800: 422: spec.replicas: Invalid value: 9: must be <= 4"
    )


def _condition(status: Mapping[str, Any], kind: str) -> tuple[str, str]:
    (c,) = [c for c in status["conditions"] if c["type"] == kind]
    return c["status"], c["reason"]


def test_status_says_what_is_so_idle_pools_finished_and_waiting_runs_stale_figures() -> None:
    kube, events = MemoryKube(), Events()
    reconciler = Reconciler(kube)
    idle = kube.put(example("RolloutPool"))
    missing = example("TrainingRun")
    missing["metadata"]["name"] = "orphan"
    missing["spec"]["pool"] = "nowhere"
    group_url = path(API_VERSION, "rolloutgroups", "default", "mixed-h800")

    async def go() -> None:
        # A pool no run is bound to starts no worker: idle, not scaling for ever.
        pool = await reconciler.pool(idle, events)
        assert _condition(pool, "Ready") == ("False", "Idle")
        assert _condition(pool, "Progressing") == ("False", "Idle")
        # A run whose pool does not exist cannot start until someone acts: Degraded.
        waiting = await reconciler.run(kube.put(missing), events)
        assert waiting["phase"] == "Waiting"
        assert _condition(waiting, "Degraded") == ("True", "PoolMissing")
        # Figures a run's loop wrote into a group go when the run has gone.
        run = await reconciler.run(kube.put(example("TrainingRun")), events)
        assert _condition(run, "Degraded") == ("False", "Valid")
        await kube.patch(group_url + "/status", {"status": {"versions": [3], "meanContext": 9}})
        finished = kube.objects[path(API_VERSION, "trainingruns", "default", "digits")]
        finished["status"] = {"phase": "Succeeded"}
        done = await reconciler.run(finished, events)
        assert _condition(done, "Ready") == ("False", "Succeeded")
        await kube.delete(path(API_VERSION, "trainingruns", "default", "digits"))
        group = await reconciler.group(kube.objects[group_url], events)
        await kube.patch(group_url + "/status", {"status": group})

    asyncio.run(go())
    status = kube.objects[group_url]["status"]
    assert "versions" not in status and "meanContext" not in status


@pytest.mark.parametrize("ttl", [None, 60])
def test_a_finished_run_stops_its_trainer_and_goes_after_its_time_to_live(
    ttl: int | None,
) -> None:
    kube, reconciler, events = _bound()
    run_url = path(API_VERSION, "trainingruns", "default", "digits")
    trainer_url = path("apps/v1", "statefulsets", "default", "digits-trainer")
    finished = kube.objects[run_url]
    finished["spec"]["completion"] = {"ttlSecondsAfterFinished": ttl}
    # Finished long ago, as its control loop wrote.
    finished["status"] = {"phase": "Succeeded", "completionTime": "2026-01-01T00:00:00Z"}
    asyncio.run(reconciler.run(finished, events))
    assert kube.objects[trainer_url]["spec"]["replicas"] == 0  # its devices are free
    assert (run_url in kube.objects) == (ttl is None)


def test_two_runs_created_at_once_never_both_bind_the_pool() -> None:
    kube, events = MemoryKube(), Events()
    reconciler = Reconciler(kube)
    pool = kube.put(example("RolloutPool"))
    first, second = example("TrainingRun"), example("TrainingRun")
    second["metadata"]["name"] = "digits-2"
    get = kube.get

    async def interleaved(url: str) -> dict[str, Any] | None:
        found = await get(url)
        await asyncio.sleep(0)  # the other run's handler reads the pool too
        return found

    kube.get = interleaved  # type: ignore[method-assign]

    async def go() -> tuple[Status, Status]:
        await reconciler.pool(pool, events)
        return await asyncio.gather(
            reconciler.run(kube.put(first), events), reconciler.run(kube.put(second), events)
        )

    statuses = asyncio.run(go())
    assert [e for e in events if e[0] == "Bound"] == [("Bound", "RolloutPool mixed")]
    assert sorted(s.get("phase", "") for s in statuses) == ["Starting", "Waiting"]
    bound = kube.objects[path(API_VERSION, "rolloutpools", "default", "mixed")]["status"]["run"]
    assert bound in ("digits", "digits-2")


def test_a_group_whose_pool_is_gone_makes_nothing_more() -> None:
    kube, reconciler, events = _bound()
    url = path(API_VERSION, "rolloutgroups", "default", "mixed-h800")
    group = kube.objects[url]

    async def go() -> Status:
        await kube.delete(path(API_VERSION, "rolloutpools", "default", "mixed"))
        return await reconciler.group(group, events)  # before the collector takes the group

    status = asyncio.run(go())
    assert status["replicas"] == 0 and _pods(kube, "h800") == []
    assert kube.of_kind("PodDisruptionBudget") == []


def test_a_trainer_that_keeps_exiting_is_said_with_its_last_words() -> None:
    # The example run on a cluster whose image has no weights: the trainer crash-looped
    # while the run said only that no worker was ready.
    kube, reconciler, events = _bound()
    reconciler.trainer_endpoint = lambda run, pool: "http://127.0.0.1:9"  # nobody there
    said = "cadence: error: /models/Qwen3-8B holds no Hugging Face model (no config.json)"
    kube.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "digits-trainer-0"},
            "status": {
                "containerStatuses": [
                    {
                        "restartCount": 3,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {
                            "terminated": {"exitCode": 2, "message": f"loading\n{said}\n"}
                        },
                    }
                ]
            },
        }
    )
    run = kube.objects[path(API_VERSION, "trainingruns", "default", "digits")]
    status = asyncio.run(reconciler.run(run, events))
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    exited = "pod digits-trainer-0 exited 4 time(s), last with code 2"
    assert ready["message"].startswith(f"the trainer does not answer: {exited}: {said}")
