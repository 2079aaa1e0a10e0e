"""What the operator creates for a pool and a run: RolloutGroups owned by the pool,
worker pods with the labels, device requests, selectors, probes and grace a cluster needs,
the headless Service, token Secret and the trainer's objects, all valid for Kubernetes
1.30; and which worker pod scale-in removes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from cadence.cli import build_parser
from cadence.operator.api.capacity import group_capacities, group_plans
from cadence.operator.api.files import load
from cadence.operator.api.resources import RolloutGroup, RolloutPool, TrainingRun
from cadence.operator.kube import children, trainer_objects
from cadence.operator.kube.scale_in import ScaleInView, choose_for_scale_in
from cadence.worker.serve import WorkerOptions, emulated_deployment
from tests.helpers import HETEROGENEOUS

EXAMPLE = HETEROGENEOUS


def _with_uid(model: Any, uid: str) -> dict[str, Any]:
    obj: dict[str, Any] = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    obj["metadata"]["uid"] = uid
    return obj


def _valid(obj: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(obj, "1.30", strict=True) == "1.30"


def test_a_pool_owns_one_rollout_group_per_group_at_its_initial_size() -> None:
    pool, _ = load(EXAMPLE)
    groups = children.rollout_groups(pool, _with_uid(pool, "pool-uid"))
    assert [(g["metadata"]["name"], g["spec"]["replicas"]) for g in groups] == [
        ("fleet-h800", 8),
        ("fleet-a910x", 16),
        ("fleet-bi-v150", 16),
    ]
    for g in groups:
        RolloutGroup.model_validate(g)
        (ref,) = g["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "RolloutPool",
            "fleet",
            "pool-uid",
            True,
        )


def test_a_worker_pod_carries_labels_devices_selectors_probes_and_a_drain_grace() -> None:
    pool, run = load(EXAMPLE)
    group = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[1])
    pod = children.worker_pod(pool, group, _with_uid(group, "group-uid"), run, 3)
    _valid(pod)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "fleet-a910x-3"
    assert (
        meta["labels"] | {} == meta["labels"]
        and {
            "app.kubernetes.io/component": "worker",
            "app.kubernetes.io/part-of": "cadence",
            "cadence.dev/pool": "fleet",
            "cadence.dev/accelerator": "A910X",
            "cadence.dev/affinity-rank": "2",
        }.items()
        <= meta["labels"].items()
    )
    assert meta["ownerReferences"][0]["uid"] == "group-uid"
    (container,) = spec["containers"]
    # Devices requested and limited as given; CPU and memory requested (never BestEffort).
    requests = container["resources"]["requests"]
    assert requests == {"huawei.com/Ascend910": "1", "cpu": "2", "memory": "8Gi"}
    assert container["resources"]["limits"] == {"huawei.com/Ascend910": "1"}
    assert spec["automountServiceAccountToken"] is False
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert spec["tolerations"] == [
        {"key": "huawei.com/Ascend910", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Liveness waits for start-up, which may load a model for minutes: ten at least.
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    grace = int(container["args"][container["args"].index("--grace-s") + 1])
    assert spec["terminationGracePeriodSeconds"] > grace  # the drain fits in the grace
    assert container["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "cadence-token"
    args = container["args"]
    assert args[args.index("--trainer-url") + 1] == "http://math-grpo-trainer.default.svc:8100"
    assert args[args.index("--env-url") + 1] == "http://sandbox.tools.svc:8080"
    h800 = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[0])
    h800_pod = children.worker_pod(pool, h800, _with_uid(h800, "g"), run, 0)
    assert h800_pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H800"}


def test_the_pool_and_run_objects_are_valid_kubernetes_objects() -> None:
    pool, run = load(EXAMPLE)
    pool_obj, run_obj = _with_uid(pool, "p"), _with_uid(run, "r")
    _valid(children.headless_service(pool, pool_obj))
    secret = children.token_secret(pool, pool_obj)
    _valid(secret)
    assert secret["data"] != children.token_secret(pool, pool_obj)["data"]  # random
    objects = trainer_objects.trainer_objects(run, run_obj, pool)
    assert [o["kind"] for o in objects] == ["ConfigMap", "StatefulSet", "Service"]
    for o in objects:
        _valid(o)
    config = json.loads(objects[0]["data"]["trainer.json"])
    assert (config["group_size"], config["batch_groups"], config["eta"]) == (16, 512, 1)
    assert config["state_dir"] == "/var/lib/cadence"
    claim = objects[1]["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    # The ledger's volume goes with the run (keepState keeps it); the trainer runs where
    # its devices are.
    retention = objects[1]["spec"]["persistentVolumeClaimRetentionPolicy"]
    assert retention == {"whenDeleted": "Delete", "whenScaled": "Delete"}
    pod = objects[1]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H800"}
    assert pod["containers"][0]["resources"]["requests"]["memory"] == "256Gi"  # as given
    assert "memory" not in pod["containers"][0]["resources"]["limits"]


W = ScaleInView


@pytest.mark.parametrize(
    ("workers", "unfinished", "count", "chosen"),
    [
        # The emptiest goes first.
        ([W("a", 1, 900, 3), W("b", 1, 100, 1), W("c", 1, 500, 2)], {1}, 1, ["b"]),
        # A concentration source goes before any other.
        ([W("a", 1, 10, 1), W("b", 2, 900, 3, source=True), W("c", 2, 5, 1)], {1, 2}, 1, ["b"]),
        # Never the last non-source worker of a version with unfinished work ...
        ([W("a", 1, 0, 0), W("b", 2, 500, 2), W("c", 2, 600, 2)], {1, 2}, 2, ["b"]),
        # ... but a version with nothing unfinished protects nothing.
        ([W("a", 1, 0, 0), W("b", 2, 500, 2)], {2}, 1, ["a"]),
        # One at a time: the second of two workers of v becomes the last, and stays.
        ([W("a", 3, 50, 1), W("b", 3, 60, 1)], {3}, 2, ["a"]),
        # A pod that is not ready (pending, unready, silent) goes before a ready one,
        # however full or empty: it serves nobody yet.
        ([W("a", 1, 0, 0), W("z", None, 0, 0, ready=False)], {1}, 1, ["z"]),
        ([W("a", 1, 0, 0), W("b", 1, 900, 3, ready=False)], {1}, 1, ["b"]),
    ],
)
def test_scale_in_chooses_by_the_design_rule(
    workers: list[ScaleInView], unfinished: set[int], count: int, chosen: list[str]
) -> None:
    assert choose_for_scale_in(workers, unfinished, count) == chosen


def test_scale_in_counts_the_pools_other_groups_as_hosts() -> None:
    a910x = [W("a910x-0", 1, 300, 3), W("a910x-1", 2, 0, 0)]
    # a910x-0 is the pool's last worker of version 1, which has work: a910x-1 goes.
    assert choose_for_scale_in(a910x, {1, 2}, 1, others=[W("h800-0", 2, 0, 0)]) == ["a910x-1"]
    # An H800 also serving version 1 frees it; the emptier a910x-1 still goes first.
    assert choose_for_scale_in(a910x, {1}, 2, others=[W("h800-0", 1, 0, 0)]) == [
        "a910x-1",
        "a910x-0",
    ]


def test_a_groups_engine_settings_reach_the_worker_it_starts(tmp_path: Path) -> None:
    """The pod's arguments are ones `cadence worker` takes, and an emulated worker started
    with them holds the KV capacity the operator planned the group with."""
    text = HETEROGENEOUS.read_text().replace(
        "engine: {maxModelLen: 32768, memoryUtilization: 0.9}",
        "engine: {maxModelLen: 32768, memoryUtilization: 0.8, tensorParallel: 4}",
    )
    text = text.replace("resources: {nvidia.com/gpu: 1}", "resources: {nvidia.com/gpu: 4}")
    (tmp_path / "pool.yaml").write_text(text)
    pool, run = load(tmp_path / "pool.yaml")
    group = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[0])
    pod = children.worker_pod(pool, group, _with_uid(group, "g"), run, 0)
    args = build_parser().parse_args(pod["spec"]["containers"][0]["args"])
    assert (args.memory_utilization, args.tensor_parallel) == (0.8, 4)
    options = WorkerOptions(
        worker_id=args.id,
        accelerator=args.accelerator,
        affinity=args.affinity,
        model=args.model,
        model_path=tmp_path,
        token="t",
        memory_utilization=args.memory_utilization,
        tensor_parallel=args.tensor_parallel,
    )
    deployment = emulated_deployment(options)
    assert deployment.tp == 4
    planned = group_capacities(pool, run)[group.spec.group]
    assert deployment.kv_capacity_tokens == planned


def test_a_group_has_a_disruption_budget_of_one_over_its_pods() -> None:
    pool, _ = load(EXAMPLE)
    group = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[0])
    pdb = children.disruption_budget(group, _with_uid(group, "g"))
    _valid(pdb)
    assert pdb["spec"]["maxUnavailable"] == 1
    selector = pdb["spec"]["selector"]["matchLabels"]
    pod = children.worker_pod(pool, group, _with_uid(group, "g"), load(EXAMPLE)[1], 0)
    assert selector.items() <= pod["metadata"]["labels"].items()


def test_a_model_claim_is_mounted_read_only_where_workers_and_trainer_read_it() -> None:
    """Issue 17, item 5: `model.uri: pvc://CLAIM/PATH` reaches both processes: the claim is
    a read-only volume at /models and each opens /models/PATH."""
    pool, run = load(EXAMPLE)
    assert run.spec.model.uri == "pvc://models/qwen3-8b"
    group = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[0])
    pod = children.worker_pod(pool, group, _with_uid(group, "g"), run, 0)
    _valid(pod)
    args = build_parser().parse_args(pod["spec"]["containers"][0]["args"])
    assert args.model_path == Path("/models/qwen3-8b")
    claim = {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    mount = {"name": "models", "mountPath": "/models", "readOnly": True}
    assert claim in pod["spec"]["volumes"]
    assert mount in pod["spec"]["containers"][0]["volumeMounts"]
    config_map, trainer, _ = trainer_objects.trainer_objects(run, _with_uid(run, "r"), pool)
    config = json.loads(config_map["data"]["trainer.json"])
    assert config["model_path"] == "/models/qwen3-8b"
    template = trainer["spec"]["template"]["spec"]
    assert claim in template["volumes"] and mount in template["containers"][0]["volumeMounts"]


def test_the_pools_worker_selector_takes_its_workers_and_not_its_runs_trainer() -> None:
    """The trainer pod carries the pool's label and answers on the workers' port: selected
    with them, the control loop took it for a worker, then for a lost one."""
    pool, run = load(EXAMPLE)
    group = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[0])
    worker = children.worker_pod(pool, group, _with_uid(group, "g"), run, 0)
    _, trainer, _ = trainer_objects.trainer_objects(run, _with_uid(run, "r"), pool)
    selector = children.worker_selector(pool.metadata.name).items()
    assert selector <= worker["metadata"]["labels"].items()
    assert not selector <= trainer["spec"]["template"]["metadata"]["labels"].items()
    assert trainer["spec"]["template"]["metadata"]["labels"]["cadence.dev/pool"] == "fleet"


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ({"uri": "s3://models/qwen3-8b"}, "String should match pattern"),
        ({"uri": "pvc://models/q", "path": "/models/q"}, "not both"),
    ],
)
def test_a_model_source_the_operator_cannot_mount_is_refused(
    model: dict[str, str], said: str
) -> None:
    _, run = load(EXAMPLE)
    body = run.model_dump(by_alias=True, exclude_none=True, mode="json")
    body["spec"]["model"] = {**model, "catalog": "Qwen3-8B"}
    with pytest.raises(ValueError, match=said):
        type(run).model_validate(body)


def test_without_a_claim_workers_open_the_models_path_or_the_catalogs_directory() -> None:
    pool, run = load(EXAMPLE)
    group = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[0])
    for model, where in (({}, "/models/Qwen3-8B"), ({"path": "/weights/q"}, "/weights/q")):
        changed = run.model_copy(
            update={"spec": run.spec.model_copy(update={"model": type(run.spec.model)(**model)})}
        )
        pod = children.worker_pod(pool, group, _with_uid(group, "g"), changed, 0)
        args = build_parser().parse_args(pod["spec"]["containers"][0]["args"])
        assert args.model_path == Path(where)
        assert all(v["name"] != "models" for v in pod["spec"]["volumes"])


OVERLAY = {
    "labels": {"team": "rl", "cadence.dev/group": "not-mine"},
    "annotations": {"example.com/owner": "rl-infra"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
        }
    ],
    "priorityClassName": "rollouts",
    "schedulerName": "volcano",
    "serviceAccountName": "rollout-reader",
    "imagePullSecrets": ["registry"],
    "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
    "volumes": [{"name": "cache", "emptyDir": {}}],
    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
}


def test_a_pod_template_overlay_reaches_worker_and_trainer_pods_under_the_operators_own() -> None:
    pool, run = load(EXAMPLE)
    group = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[0])
    plain = children.worker_pod(pool, group, _with_uid(group, "g"), run, 0)
    obj = _with_uid(group, "g")
    obj["spec"]["template"] = OVERLAY
    group = RolloutGroup.model_validate(obj)
    pod = children.worker_pod(pool, group, obj, run, 0)
    _valid(pod)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"]["team"] == "rl"
    assert meta["labels"]["cadence.dev/group"] == group.spec.group  # the operator's label wins
    assert meta["annotations"] == {"example.com/owner": "rl-infra"}
    for key in ("affinity", "topologySpreadConstraints", "priorityClassName", "schedulerName"):
        assert spec[key] == OVERLAY[key]
    assert spec["serviceAccountName"] == "rollout-reader"
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    main = spec["containers"][0]
    names = [e["name"] for e in main["env"]]
    assert names == ["CADENCE_TOKEN", "UCX_TCP_PORT_RANGE", "HF_HUB_OFFLINE"]  # the overlay's last
    assert main["volumeMounts"][-1] == {"name": "cache", "mountPath": "/cache"}
    assert spec["volumes"][0]["name"] == "shm" and spec["volumes"][-1]["name"] == "cache"
    assert main["args"] == plain["spec"]["containers"][0]["args"]
    # A changed overlay is a changed template: the group's pods are replaced, one at a time.
    label = children.TEMPLATE_LABEL
    assert meta["labels"][label] != plain["metadata"]["labels"][label]

    body = _with_uid(run, "r")
    body["spec"]["trainer"]["template"] = {"priorityClassName": "training"}
    trainer = trainer_objects.trainer_objects(type(run).model_validate(body), body, pool)[1]
    _valid(trainer)
    assert trainer["spec"]["template"]["spec"]["priorityClassName"] == "training"


@pytest.mark.parametrize(
    ("overlay", "said"),
    [
        ({"volumes": [{"name": "shm", "emptyDir": {}}]}, "volume name 'shm' is the operator's"),
        ({"env": [{"name": "CADENCE_TOKEN", "value": "x"}]}, "env name 'CADENCE_TOKEN'"),
        ({"env": [{"name": "UCX_TCP_PORT_RANGE", "value": "1-9"}]}, "'UCX_TCP_PORT_RANGE'"),
        ({"volumeMounts": [{"name": "cache"}]}, "needs a name and a mountPath"),
        ({"labels": {"bad key!": "x"}}, "is not a label key"),
    ],
)
def test_an_overlay_that_would_take_the_operators_names_is_refused(
    overlay: dict[str, Any], said: str
) -> None:
    pool, _ = load(EXAMPLE)
    obj = _with_uid(
        RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[0]), "g"
    )
    obj["spec"]["template"] = overlay
    with pytest.raises(ValueError, match=said):
        RolloutGroup.model_validate(obj)


def test_a_worker_starts_at_the_degree_capacity_planning_chose(tmp_path: Path) -> None:
    """`tensorParallel` unset: the operator plans each group at the smallest degree that
    holds the longest trajectory, and starts its workers at that degree, not at 1."""
    text = HETEROGENEOUS.read_text().replace("catalog: Qwen3-8B", "catalog: Qwen3-32B")
    for device in ("nvidia.com/gpu: 1}", 'huawei.com/Ascend910: "1"', 'iluvatar.ai/gpu: "1"'):
        text = text.replace(device, device[:-2] + device[-2:].replace("1", "8"))  # 8 a pod
    (tmp_path / "pool.yaml").write_text(text)
    pool, run = load(tmp_path / "pool.yaml")
    plans = group_plans(pool, run)
    assert any(tp > 1 for tp, _ in plans.values())  # the 32B model needs more than 1 here
    for obj in children.rollout_groups(pool, _with_uid(pool, "p")):
        group = RolloutGroup.model_validate(obj)
        pod = children.worker_pod(pool, group, _with_uid(group, "g"), run, 0)
        args = build_parser().parse_args(pod["spec"]["containers"][0]["args"])
        assert args.tensor_parallel == plans[group.spec.group][0]


def test_a_calculator_run_gets_the_reference_environment_beside_its_trainer() -> None:
    """`multiTurn.environment: calculator` on a cluster: the trainer's pod runs `cadence
    environment` too, its Service exposes it, and every worker calls it there."""
    pool, run = load(EXAMPLE)
    body = _with_uid(run, "r")
    body["spec"]["multiTurn"] = {"environment": "calculator", "maxToolCalls": 2, "tries": 2}
    run = type(run).model_validate(body)
    _, trainer, service = trainer_objects.trainer_objects(run, body, pool)
    _valid(trainer)
    (env,) = [
        c for c in trainer["spec"]["template"]["spec"]["containers"] if c["name"] == "environment"
    ]
    served = build_parser().parse_args(env["args"])
    port = {p["name"]: p["port"] for p in service["spec"]["ports"]}["environment"]
    assert served.port == port and served.host == "0.0.0.0"
    group = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[0])
    pod = children.worker_pod(pool, group, _with_uid(group, "g"), run, 0)
    args = build_parser().parse_args(pod["spec"]["containers"][0]["args"])
    assert args.env_url == f"http://math-grpo-trainer.default.svc:{port}"
    assert args.env_tries == 2


def _calculator_run() -> tuple[RolloutPool, TrainingRun, dict[str, Any]]:
    pool, run = load(EXAMPLE)
    body = _with_uid(run, "r")
    body["spec"]["multiTurn"] = {"environment": "calculator", "maxToolCalls": 2, "tries": 2}
    return pool, type(run).model_validate(body), body


def _containers(trainer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in trainer["spec"]["template"]["spec"]["containers"]}


def test_the_calculator_beside_the_trainer_takes_the_pools_token() -> None:
    """The environment refuses callers without the pool's token, so its container gets
    the token from the pool's Secret, as the trainer beside it does."""
    pool, run, body = _calculator_run()
    _, trainer, _ = trainer_objects.trainer_objects(run, body, pool)
    containers = _containers(trainer)
    token = {
        "name": "CADENCE_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": pool.spec.token_secret, "key": "token"}},
    }
    assert token in containers["environment"]["env"]
    assert containers["environment"]["env"] == containers["trainer"]["env"]


def _with_tls(pool: RolloutPool, secret: str = "fleet-tls") -> RolloutPool:
    """The pool asking for TLS (`spec.tlsSecret`; set past validation until the pool's
    schema has the field, which children.py reads with a default)."""
    return pool.model_copy(update={"spec": pool.spec.model_copy(update={"tls_secret": secret})})


def test_a_pool_that_names_a_tls_secret_serves_every_pod_over_https() -> None:
    plain, run, body = _calculator_run()
    pool = _with_tls(plain)
    group = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(plain, "p"))[0])
    pod = children.worker_pod(pool, group, _with_uid(group, "g"), run, 0)
    _valid(pod)
    (worker,) = pod["spec"]["containers"]
    args = build_parser().parse_args(worker["args"])
    assert (args.tls_cert, args.tls_key) == (
        Path("/etc/cadence-tls/tls.crt"),
        Path("/etc/cadence-tls/tls.key"),
    )
    assert args.trainer_url == "https://math-grpo-trainer.default.svc:8100"
    assert args.env_url == "https://math-grpo-trainer.default.svc:8200"
    assert {"name": "CADENCE_CA_FILE", "value": "/etc/cadence-tls/ca.crt"} in worker["env"]
    assert {"name": "tls", "secret": {"secretName": "fleet-tls"}} in pod["spec"]["volumes"]
    mount = {"name": "tls", "mountPath": "/etc/cadence-tls", "readOnly": True}
    assert mount in worker["volumeMounts"]
    assert worker["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert worker["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    # Reached by the name its certificate holds, not by its IP.
    pod["status"] = {"podIP": "10.0.0.7"}
    assert children.pod_url(pod) == "https://fleet-h800-0.fleet-workers.default.svc:8000"

    objects = trainer_objects.trainer_objects(run, body, pool)
    for obj in objects:
        _valid(obj)
    trainer = objects[1]
    containers = _containers(trainer)
    assert trainer["spec"]["template"]["spec"]["volumes"][-1] == {
        "name": "tls",
        "secret": {"secretName": "fleet-tls"},
    }
    for name in ("trainer", "environment"):
        served = build_parser().parse_args(containers[name]["args"])
        assert served.tls_cert == Path("/etc/cadence-tls/tls.crt"), name
        assert mount in containers[name]["volumeMounts"], name
    assert containers["trainer"]["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert children.trainer_url(run, pool).startswith("https://")


def test_a_pool_without_tls_serves_plain_http_reached_by_ip() -> None:
    pool, run, _ = _calculator_run()
    group = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[0])
    pod = children.worker_pod(pool, group, _with_uid(group, "g"), run, 0)
    (worker,) = pod["spec"]["containers"]
    args = build_parser().parse_args(worker["args"])
    assert args.tls_cert is None and args.trainer_url.startswith("http://")
    assert "scheme" not in worker["readinessProbe"]["httpGet"]
    assert all(v["name"] != "tls" for v in pod["spec"]["volumes"])
    assert children.pod_url(pod) is None  # no IP yet
    pod["status"] = {"podIP": "10.0.0.7"}
    assert children.pod_url(pod) == "http://10.0.0.7:8000"


def _pool_and_run(tmp_path: Path, *, backend: str = "vllm", migration: str = "auto") -> Any:
    """The heterogeneous example with every group on `backend` and the run's `migration`."""
    text = HETEROGENEOUS.read_text().replace("engine: {", f"engine: {{backend: {backend}, ")
    text = text.replace("  scheduler:\n", f"  scheduler:\n    migration: {migration}\n", 1)
    (tmp_path / "pool.yaml").write_text(text)
    pool, run = load(tmp_path / "pool.yaml")
    assert {g.engine.backend for g in pool.spec.groups} == {backend}
    assert run.spec.scheduler.migration == migration
    return pool, run


def _first_worker(pool: RolloutPool, run: TrainingRun, index: int = 0) -> dict[str, Any]:
    group = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[0])
    return children.worker_pod(pool, group, _with_uid(group, "g"), run, index)


def _kv_parts(pod: dict[str, Any]) -> tuple[list[str], list[Any], list[Any]]:
    """The worker container's --kv-transfer-port flag and value, its kv-transfer ports and
    its UCX environment."""
    (worker,) = pod["spec"]["containers"]
    args = worker["args"]
    flag = args[args.index("--kv-transfer-port") :][:2] if "--kv-transfer-port" in args else []
    ports = [p for p in worker["ports"] if p["name"] != "control"]
    env = [e for e in worker["env"] if e["name"].startswith(("UCX_", "VLLM_"))]
    return flag, ports, env


def test_a_vllm_workers_pod_opens_the_kv_transfer_side_channel_and_pins_ucx(
    tmp_path: Path,
) -> None:
    pool, run = _pool_and_run(tmp_path)
    pod = _first_worker(pool, run)
    _valid(pod)
    flag, ports, env = _kv_parts(pod)
    assert flag == ["--kv-transfer-port", "5600"]
    assert ports == [{"name": "kv-transfer", "containerPort": 5600}]
    assert env == [{"name": "UCX_TCP_PORT_RANGE", "value": "5601-5999"}]
    # Still a worker's control port first, which the probes and the Service name.
    assert pod["spec"]["containers"][0]["ports"][0] == {"name": "control", "containerPort": 8000}
    # The default run (migration: auto) moves KV as well.
    assert _kv_parts(_first_worker(*load(EXAMPLE))) == (flag, ports, env)


@pytest.mark.parametrize(
    ("backend", "migration"), [("emulated", "auto"), ("emulated", "kv"), ("vllm", "reprefill")]
)
def test_a_worker_that_never_moves_kv_opens_no_port_for_it(
    tmp_path: Path, backend: str, migration: str
) -> None:
    """Emulated workers have no KV cache to move; a reprefill run never pulls one."""
    pool, run = _pool_and_run(tmp_path, backend=backend, migration=migration)
    pod = _first_worker(pool, run)
    _valid(pod)
    assert _kv_parts(pod) == ([], [], [])
    assert [p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]] == [8000]


def test_a_runs_migration_setting_reaches_its_pods_template(tmp_path: Path) -> None:
    """Pods started for an auto run differ from a reprefill run's (their template hash),
    so a run changed to reprefill rolls its workers."""
    auto = _first_worker(*_pool_and_run(tmp_path))
    (tmp_path / "r").mkdir()
    reprefill = _first_worker(*_pool_and_run(tmp_path / "r", migration="reprefill"))
    hashed = children.TEMPLATE_LABEL
    assert auto["metadata"]["labels"][hashed] != reprefill["metadata"]["labels"][hashed]


def _selects(selector: dict[str, Any], pod: dict[str, Any]) -> bool:
    assert set(selector) == {"matchLabels"}  # no expressions to evaluate
    return bool(selector["matchLabels"].items() <= pod["metadata"]["labels"].items())


def _policy(pool: RolloutPool, namespace: str = "cadence-system") -> dict[str, Any]:
    policy = children.worker_policy(
        pool,
        _with_uid(pool, "pool-uid"),
        operator_namespace=namespace,
        scrapers_namespace="monitoring",
    )
    _valid(policy)
    return policy


def test_a_vllm_pools_policy_admits_kv_transfer_only_from_its_own_workers(
    tmp_path: Path,
) -> None:
    pool, run = _pool_and_run(tmp_path)
    policy = _policy(pool)
    meta, spec = policy["metadata"], policy["spec"]
    assert (policy["kind"], meta["name"], meta["namespace"]) == (
        "NetworkPolicy",
        "fleet-workers",
        "default",
    )
    assert meta["ownerReferences"][0]["uid"] == "pool-uid"  # goes with its pool
    assert spec["policyTypes"] == ["Ingress"]
    rule = spec["ingress"][-1]
    (source,) = rule["from"]  # pods only: no namespaceSelector, no ipBlock
    assert set(source) == {"podSelector"}
    worker_labels = {"cadence.dev/pool": "fleet", "app.kubernetes.io/component": "worker"}
    assert spec["podSelector"] == source["podSelector"] == {"matchLabels": worker_labels}
    assert rule["ports"] == [
        {"protocol": "TCP", "port": 5600},
        {"protocol": "TCP", "port": 5601, "endPort": 5999},
    ]

    # It selects this pool's workers of every group, as targets and as sources...
    for index, group in enumerate(children.rollout_groups(pool, _with_uid(pool, "p"))):
        g = RolloutGroup.model_validate(group)
        pod = children.worker_pod(pool, g, _with_uid(g, "g"), run, index)
        assert _selects(spec["podSelector"], pod) and _selects(source["podSelector"], pod)
    # ...and not another pool's workers, nor the trainer.
    other = _first_worker(
        pool.model_copy(update={"metadata": pool.metadata.model_copy(update={"name": "other"})}),
        run,
    )
    assert not _selects(source["podSelector"], other)
    trainer = trainer_objects.trainer_objects(run, _with_uid(run, "r"), pool)[1]
    assert not _selects(source["podSelector"], trainer["spec"]["template"])

    # The ports it opens are the ones the pod listens on: its side channel, UCX's range.
    flag, ports, env = _kv_parts(_first_worker(pool, run))
    assert rule["ports"][0]["port"] == int(flag[1]) == ports[0]["containerPort"]
    first, last = env[0]["value"].split("-")
    assert (rule["ports"][1]["port"], rule["ports"][1]["endPort"]) == (int(first), int(last))


def test_every_pools_workers_take_control_calls_from_the_operator_trainer_and_peers(
    tmp_path: Path,
) -> None:
    """A pool outside the operator's namespace had only its KV policy there, which
    isolated its workers with port 8000 closed: the operator could not reach them."""
    pool, run = _pool_and_run(tmp_path, backend="emulated")
    policy = _policy(pool, namespace="rl-ops")
    spec = policy["spec"]
    control, scrape = spec["ingress"]  # an emulated pool: no KV rule
    assert control["ports"] == scrape["ports"] == [{"protocol": "TCP", "port": 8000}]
    operator, trainer_source, workers = control["from"]
    assert operator == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "rl-ops"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "cadence-operator"}},
    }
    assert scrape["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    trainer = trainer_objects.trainer_objects(run, _with_uid(run, "r"), pool)[1]
    assert _selects(trainer_source["podSelector"], trainer["spec"]["template"])
    assert _selects(workers["podSelector"], _first_worker(pool, run))
    assert _selects(spec["podSelector"], _first_worker(pool, run))
    # Another pool's trainer is not admitted.
    other = pool.model_copy(update={"metadata": pool.metadata.model_copy(update={"name": "x"})})
    theirs = trainer_objects.trainer_objects(run, _with_uid(run, "r"), other)[1]
    assert not _selects(trainer_source["podSelector"], theirs["spec"]["template"])


def test_every_pod_the_operator_makes_meets_the_restricted_pod_security_standard() -> None:
    # A namespace labelled pod-security.kubernetes.io/enforce=restricted admits a pod
    # only with these; without runAsNonRoot every worker and trainer pod was refused.
    pool, run = load(EXAMPLE)
    group = RolloutGroup.model_validate(children.rollout_groups(pool, _with_uid(pool, "p"))[0])
    worker = children.worker_pod(pool, group, _with_uid(group, "g"), run, 0)["spec"]
    body = _with_uid(run, "r")
    (trainer,) = [
        o["spec"]["template"]["spec"]
        for o in trainer_objects.trainer_objects(run, body, pool)
        if o["kind"] == "StatefulSet"
    ]
    for spec in (worker, trainer):
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"] + spec.get("initContainers", []):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
