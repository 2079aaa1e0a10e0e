"""The operator (kopf, `operator/kube/handlers.py`) against the test Kubernetes emulator,
on fake time (`fake_cluster.py`): a pool gets its RolloutGroups, a run binds it and gets
its trainer, each group gets worker pods with the labels, devices and owner a cluster
needs, `/scale` on a group moves its pods, an invalid pool is Degraded with the field
and an Event while others go on, and a second run on a busy pool waits saying why.
`kubectl get` shows the printer columns (on real time: kubectl is another program)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cadence.devcluster.emulator import KubernetesEmulator, write_kubeconfig
from tests.helpers import eventually, example

from .fake_cluster import Cluster, emulating, on_fake_time, operating, operator
from .harness import (
    EXAMPLE,
    NS,
    OPERATOR_S,
    _rbac_allows_what_the_operator_did,
    _status,
    operator_on,
)

# A test against the operator takes seconds; the end-to-end ones say more.
pytestmark = pytest.mark.timeout(120)


@on_fake_time
async def test_a_pool_and_a_run_get_groups_pods_and_a_trainer() -> None:
    async with operating() as c:
        pool = await c.call("POST", f"{NS}/rolloutpools", example("RolloutPool"))

        async def two_groups() -> bool:
            return len((await c.call("GET", f"{NS}/rolloutgroups"))["items"]) == 2

        await c.until(two_groups, "the pool's two RolloutGroups")
        groups = (await c.call("GET", f"{NS}/rolloutgroups"))["items"]
        assert sorted(g["metadata"]["name"] for g in groups) == ["mixed-a910x", "mixed-h800"]
        for g in groups:
            assert g["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]
        assert await c.pods() == []  # no run bound: a worker needs the run's model
        run = await c.call("POST", f"{NS}/trainingruns", example("TrainingRun"))

        async def four_pods() -> bool:
            return len(await c.pods()) == 4

        await c.until(four_pods, "4 worker pods")
        assert (await c.call("GET", f"{NS}/rolloutpools/mixed"))["status"]["run"] == "digits"
        h800 = sorted(await c.pods("h800"), key=lambda p: p["metadata"]["name"])
        assert [p["metadata"]["name"] for p in h800] == ["mixed-h800-0", "mixed-h800-1"]
        labels = h800[0]["metadata"]["labels"]
        assert labels["cadence.dev/accelerator"] == "H800"
        assert labels["cadence.dev/affinity-rank"] == "2"
        assert labels["app.kubernetes.io/component"] == "worker"
        group_uid = next(g for g in groups if g["spec"]["group"] == "h800")["metadata"]["uid"]
        assert h800[0]["metadata"]["ownerReferences"][0]["uid"] == group_uid
        container = h800[0]["spec"]["containers"][0]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        for kind, path in (
            ("StatefulSet", "/apis/apps/v1/namespaces/default/statefulsets/digits-trainer"),
            ("Service", "/api/v1/namespaces/default/services/digits-trainer"),
            ("ConfigMap", "/api/v1/namespaces/default/configmaps/digits-trainer"),
        ):
            obj = await c.call("GET", path)
            assert obj["kind"] == kind
            assert obj["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
        # The workers take control calls from the operator, trainer and peers in the
        # pool's own namespace; a vLLM pool's workers may pull each other's KV caches.
        policy = await c.call(
            "GET", "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/mixed-workers"
        )
        assert policy["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]
        assert policy["spec"]["podSelector"]["matchLabels"]["cadence.dev/pool"] == "mixed"
        assert [r["ports"][0]["port"] for r in policy["spec"]["ingress"]] == [8000, 8000, 5600]

        async def run_status() -> dict[str, object]:
            return await c.status(f"{NS}/trainingruns/digits")

        status = await c.until(run_status, "the run's status")
        # Bound, but no trainer answers and no pod is ready here: Starting, and Ready
        # says why.
        assert status["phase"] == "Starting"
        conditions = status["conditions"]
        assert isinstance(conditions, list)
        (ready,) = [cond for cond in conditions if cond["type"] == "Ready"]
        assert ready["status"] == "False"
        assert "the trainer does not answer yet" in ready["message"]

        async def selector() -> str | None:
            found: str | None = (await c.status(f"{NS}/rolloutgroups/mixed-h800")).get("selector")
            return found

        group = await c.until(selector, "the h800 group's selector in its status")
        assert group == "cadence.dev/pool=mixed,cadence.dev/group=h800"


async def _a910x(c: Cluster, n: int) -> None:
    async def there() -> bool:
        return len(await c.pods("a910x")) == n

    await c.until(there, f"{n} a910x pods")


@on_fake_time
async def test_scale_on_a_group_moves_its_pods() -> None:
    async with operating() as c:
        await c.call("POST", f"{NS}/rolloutpools", example("RolloutPool"))
        await c.call("POST", f"{NS}/trainingruns", example("TrainingRun"))
        await _a910x(c, 2)
        group = f"{NS}/rolloutgroups/mixed-a910x"
        await c.call("PATCH", f"{group}/scale", {"spec": {"replicas": 3}})
        await _a910x(c, 3)
        assert (await c.call("GET", f"{group}/scale"))["spec"]["replicas"] == 3
        await c.call("PATCH", f"{group}/scale", {"spec": {"replicas": 1}})
        await _a910x(c, 1)
        assert len(await c.pods("h800")) == 2  # the other group is its own
        # The pool's replicas were only the initial value: the pool re-applied and
        # reconciled again (it ensures its groups) leaves the group at the size it was
        # scaled to.
        spec = example("RolloutPool")["spec"]
        await c.call("PATCH", f"{NS}/rolloutpools/mixed", {"spec": spec})
        await c.reconciled_again("rolloutpools", "mixed")
        await c.reconciled_again("rolloutgroups", "mixed-a910x")
        assert (await c.call("GET", group))["spec"]["replicas"] == 1
        assert (await c.call("GET", f"{group}/scale"))["spec"]["replicas"] == 1
        assert len(await c.pods("a910x")) == 1
        pool = await c.call("GET", f"{NS}/rolloutpools/mixed")
        assert pool["spec"]["groups"][1]["replicas"] == 2


@on_fake_time
async def test_an_invalid_pool_is_degraded_with_an_event_and_others_go_on() -> None:
    async with operating() as c:
        bad = example("RolloutPool")
        bad["metadata"]["name"] = "broken"
        # What the CRD's schema admits and the model refuses (a map's keys are checked by
        # the model only: a CEL rule over them can exceed the API server's cost budget).
        bad["spec"]["groups"][0]["nodeSelector"] = {"bad key!": "x"}
        await c.call("POST", f"{NS}/rolloutpools", bad)
        await c.call("POST", f"{NS}/rolloutpools", example("RolloutPool"))

        async def conditions() -> list[dict[str, str]] | None:
            found = (await c.status(f"{NS}/rolloutpools/broken")).get("conditions")
            return found

        said = await c.until(conditions, "the broken pool's conditions")
        degraded = next(cond for cond in said if cond["type"] == "Degraded")
        assert degraded["status"] == "True" and degraded["reason"] == "Invalid"
        name = bad["spec"]["groups"][0]["name"]
        assert degraded["message"].startswith(
            f"spec.groups[{name}].nodeSelector: node selector key"
        )

        async def invalid() -> list[dict[str, object]]:
            return await c.events("Invalid")

        events = await c.until(invalid, "an Invalid event")
        involved = events[0]["involvedObject"]
        assert isinstance(involved, dict) and involved["name"] == "broken"
        assert events[0]["type"] == "Warning"
        # Its resync retries it, and finds it as invalid: the same reason is not
        # announced again.
        await c.reconciled_again("rolloutpools", "broken", times=3)
        assert len(await c.events("Invalid")) == 1

        async def groups() -> list[dict[str, dict[str, str]]]:
            found = (await c.call("GET", f"{NS}/rolloutgroups"))["items"]
            return found  # type: ignore[no-any-return]

        made = await c.until(groups, "the valid pool's groups")
        assert {g["spec"]["pool"] for g in made} == {"mixed"}  # the valid pool went on


@on_fake_time
async def test_a_run_too_long_for_a_group_is_degraded_naming_it() -> None:
    async with operating() as c:
        pool = example("RolloutPool")
        pool["spec"]["groups"][1]["engine"] = {"tensorParallel": 1, "maxModelLen": 200000}
        await c.call("POST", f"{NS}/rolloutpools", pool)
        run = example("TrainingRun")
        run["spec"]["model"]["catalog"] = "Qwen3-32B"
        await c.call("POST", f"{NS}/trainingruns", run)

        async def conditions() -> list[dict[str, str]] | None:
            found = (await c.status(f"{NS}/trainingruns/digits")).get("conditions")
            return found

        status = await c.until(conditions, "the run's conditions")
        degraded = next(cond for cond in status if cond["type"] == "Degraded")
        assert degraded["status"] == "True"
        assert degraded["message"].startswith("spec.model: Qwen3-32B on this pool: KV capacity")
        assert "a910x (" in degraded["message"]
        assert (await c.status(f"{NS}/rolloutpools/mixed")).get("run") is None  # not bound
        assert await c.pods() == []


@on_fake_time
async def test_a_second_run_on_a_busy_pool_waits_saying_why() -> None:
    async with operating() as c:
        await c.call("POST", f"{NS}/rolloutpools", example("RolloutPool"))
        await c.call("POST", f"{NS}/trainingruns", example("TrainingRun"))

        async def bound() -> bool:
            return (await c.status(f"{NS}/rolloutpools/mixed")).get("run") == "digits"

        await c.until(bound, "the pool bound to the first run")
        second = example("TrainingRun")
        second["metadata"]["name"] = "digits-2"
        await c.call("POST", f"{NS}/trainingruns", second)

        async def second_status() -> dict[str, object]:
            return await c.status(f"{NS}/trainingruns/digits-2")

        status = await c.until(second_status, "the second run's status")
        assert status["phase"] == "Waiting"
        conditions = status["conditions"]
        assert isinstance(conditions, list)
        (ready,) = [cond for cond in conditions if cond["type"] == "Ready"]
        assert ready["reason"] == "PoolBusy" and "serves TrainingRun digits" in ready["message"]

        async def waiting() -> list[dict[str, object]]:
            return await c.events("Waiting")

        said = await c.until(waiting, "a Waiting event")
        involved = said[0]["involvedObject"]
        assert isinstance(involved, dict) and involved["name"] == "digits-2"
        # Still waiting: said once.
        await c.reconciled_again("trainingruns", "digits-2", times=3)
        assert len(await c.events("Waiting")) == 1


@on_fake_time
async def test_deleting_a_run_removes_its_children_and_the_pool_serves_the_next() -> None:
    kube = KubernetesEmulator()
    async with operating(kube) as c:
        await _delete_a_run(c)
    _rbac_allows_what_the_operator_did(kube)


async def _delete_a_run(c: Cluster) -> None:
    await c.call("POST", f"{NS}/rolloutpools", example("RolloutPool"))
    await c.call("POST", f"{NS}/trainingruns", example("TrainingRun"))

    async def four_pods() -> bool:
        return len(await c.pods()) == 4

    await c.until(four_pods, "4 worker pods")
    second = example("TrainingRun")
    second["metadata"]["name"] = "digits-2"
    await c.call("POST", f"{NS}/trainingruns", second)

    async def second_waits() -> bool:
        return (await c.status(f"{NS}/trainingruns/digits-2")).get("phase") == "Waiting"

    await c.until(second_waits, "the second run Waiting")
    await c.call("DELETE", f"{NS}/trainingruns/digits")
    trainer = [
        f"/{kind}/digits-trainer"
        for kind in (
            "apis/apps/v1/namespaces/default/statefulsets",
            "api/v1/namespaces/default/services",
            "api/v1/namespaces/default/configmaps",
        )
    ]

    async def trainer_gone() -> bool:  # owner references
        return all([await c.get(p) is None for p in trainer])

    await c.until(trainer_gone, "the deleted run's trainer objects gone")

    async def next_bound() -> bool:
        return (await c.status(f"{NS}/rolloutpools/mixed")).get("run") == "digits-2"

    await c.until(next_bound, "the pool bound to the second run")

    # The old run's workers went; the pool's groups have pods of the new run.
    async def new_pods() -> bool:
        runs = sorted(p["metadata"]["labels"]["cadence.dev/run"] for p in await c.pods())
        return runs == ["digits-2"] * 4

    await c.until(new_pods, "4 pods, all of the second run")
    assert await c.get("/apis/apps/v1/namespaces/default/statefulsets/digits-2-trainer")
    events = (await c.call("GET", "/api/v1/namespaces/default/events"))["items"]
    assert {"Released", "Retired", "Bound"} <= {e.get("reason") for e in events}
    # Deleting the pool takes its groups, their pods, its Service and Secret.
    await c.call("DELETE", f"{NS}/rolloutpools/mixed")

    async def groups_gone() -> bool:
        return (await c.call("GET", f"{NS}/rolloutgroups"))["items"] == []  # type: ignore[no-any-return]

    await c.until(groups_gone, "the deleted pool's groups gone")
    assert await c.pods() == []
    assert await c.get("/api/v1/namespaces/default/secrets/cadence-token") is None
    assert await c.get("/api/v1/namespaces/default/services/mixed-workers") is None


KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


@on_fake_time
async def test_no_object_waits_on_the_operator_to_be_deleted() -> None:
    """Nothing Cadence makes carries a finalizer (an earlier version's is taken off), so
    with the operator stopped a pool and a run still delete, and the garbage collector
    takes their children."""
    async with emulating() as c:
        old = example("RolloutPool")
        old["metadata"]["finalizers"] = [KOPF_FINALIZER]  # as an earlier operator left it
        await c.call("POST", f"{NS}/rolloutpools", old)
        async with operator(c) as reconciler:
            await c.call("POST", f"{NS}/trainingruns", example("TrainingRun"))

            async def four_pods() -> bool:
                return len(await c.pods()) == 4

            await c.until(four_pods, "4 pods")

            async def controlled() -> bool:
                return ("default", "digits") in reconciler.controlling

            await c.until(controlled, "the run's control loop")

            async def finalizer_off() -> bool:
                pool = await c.call("GET", f"{NS}/rolloutpools/mixed")
                return not pool["metadata"].get("finalizers")

            await c.until(finalizer_off, "the old finalizer taken off")
            await c.call("DELETE", f"{NS}/trainingruns/digits")

            async def loop_ended() -> bool:  # its DELETED event ends its loop
                return ("default", "digits") not in reconciler.controlling

            await c.until(loop_ended, "the deleted run's loop ended")
            await c.call("POST", f"{NS}/trainingruns", example("TrainingRun"))

            async def starting() -> bool:
                return (await c.status(f"{NS}/trainingruns/digits")).get("phase") == "Starting"

            await c.until(starting, "the run made again, Starting")
        for plural in ("rolloutpools", "rolloutgroups", "trainingruns"):
            for obj in (await c.call("GET", f"{NS}/{plural}"))["items"]:
                assert not obj["metadata"].get("finalizers"), obj["metadata"]["name"]
        await c.call("DELETE", f"{NS}/trainingruns/digits")
        await c.call("DELETE", f"{NS}/rolloutpools/mixed")
        assert await c.get(f"{NS}/trainingruns/digits") is None
        assert await c.get(f"{NS}/rolloutpools/mixed") is None
        assert (await c.call("GET", f"{NS}/rolloutgroups"))["items"] == []
        assert await c.pods() == []


@pytest.mark.kubectl
def test_kubectl_shows_the_columns(tmp_path: Path) -> None:
    with operator_on() as cluster:
        config = write_kubeconfig(tmp_path / "kubeconfig", cluster)
        kubectl = ["kubectl", "--kubeconfig", str(config)]
        subprocess.run([*kubectl, "apply", "-f", str(EXAMPLE)], check=True, capture_output=True)
        eventually(
            lambda: _status(cluster, f"{NS}/trainingruns/digits").get("phase"),
            timeout_s=OPERATOR_S,
            what="the run's phase",
        )
        eventually(
            lambda: _status(cluster, f"{NS}/rolloutpools/mixed").get("ready"),
            timeout_s=OPERATOR_S,
            what="the pool's ready count",
        )
        out = subprocess.run(
            [*kubectl, "get", "rolloutpools,rolloutgroups,trainingruns"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    print(out)  # docs/kubernetes.md quotes it
    lines = [line.split() for line in out.splitlines() if line.strip()]
    assert lines[0] == ["NAME", "READY", "WORKERS", "RUN", "VERSIONS", "TOK/S", "DEGRADED", "AGE"]
    assert lines[1][0] == "rolloutpool.cadence.dev/mixed"
    assert lines[1][-2] == "False"  # Degraded, from its condition
    header = ["NAME", "POOL", "PHASE", "VERSION", "TOK/S", "P95", "READY", "DEGRADED", "AGE"]
    assert header in lines
    run_row = next(line for line in lines if line[0] == "trainingrun.cadence.dev/digits")
    assert run_row[1:3] == ["mixed", "Starting"]  # no trainer answers here
