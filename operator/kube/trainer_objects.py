"""What a TrainingRun gets on the cluster: its trainer's ConfigMap (the trainer's config),
StatefulSet (one pod with a claim for its ledger and weights, and the reference
calculator beside it when the run is multi-turn) and Service."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cadence.operator.api.resources import (
    RolloutPool,
    TrainingRun,
)
from cadence.operator.api.settings import trainer_config
from cadence.operator.kube.children import (
    CONTAINER_SECURITY,
    ENVIRONMENT_PORT,
    MODELS_DIR,
    POD_SECURITY,
    TRAINER_BASE,
    TRAINER_PORT,
    TRAINER_STATE,
    labels,
    model_mounts,
    model_volumes,
    overlaid,
    owner,
    pod_resources,
    probe,
    tls_args,
    tls_mounts,
    tls_volumes,
    token_env,
    trainer_name,
)


def _calculator(run: TrainingRun, pool: RolloutPool, image: str) -> list[dict[str, Any]]:
    """The reference calculator, a second container in the trainer's pod, when the run
    names it (`cadence run` starts it as a process); it takes the pool's token, as the
    trainer does, and its certificate."""
    if run.spec.multi_turn.environment != "calculator":
        return []
    return [
        {
            "name": "environment",
            "image": image,
            "args": [
                "environment",
                *("--host", "0.0.0.0", "--port", str(ENVIRONMENT_PORT)),
                *tls_args(pool),
            ],
            "ports": [{"name": "environment", "containerPort": ENVIRONMENT_PORT}],
            "env": [token_env(pool)],
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
            "securityContext": CONTAINER_SECURITY,
            "readinessProbe": {"tcpSocket": {"port": "environment"}},
            "volumeMounts": tls_mounts(pool),
        }
    ]


def trainer_objects(
    run: TrainingRun, run_obj: Mapping[str, Any], pool: RolloutPool
) -> list[dict[str, Any]]:
    """The trainer's ConfigMap (its TrainerConfig), StatefulSet (ledger and weights on a
    PersistentVolumeClaim) and Service."""
    name, ns = trainer_name(run), run.metadata.namespace
    meta = {"namespace": ns, "labels": labels(pool.metadata.name, "trainer")}
    refs = [owner(run_obj)]
    selector = {"cadence.dev/run": run.metadata.name, "app.kubernetes.io/component": "trainer"}
    pod_labels = {**labels(pool.metadata.name, "trainer"), "cadence.dev/run": run.metadata.name}
    t = run.spec.trainer
    placement: dict[str, Any] = {}
    if t.node_selector:
        placement["nodeSelector"] = dict(t.node_selector)
    if t.tolerations:
        placement["tolerations"] = [x.model_dump(exclude_none=True) for x in t.tolerations]
    kept = "Retain" if t.keep_state else "Delete"
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, **meta, "ownerReferences": refs},
            "data": {
                "trainer.json": trainer_config(
                    run, Path(run.spec.model.in_pod(MODELS_DIR)), Path(TRAINER_STATE)
                ).model_dump_json(indent=2)
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name, **meta, "ownerReferences": refs},
            "spec": {
                "replicas": 1,
                "serviceName": name,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": pod_labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "trainer",
                                "image": run.spec.trainer.image or pool.spec.image,
                                "args": [
                                    "trainer",
                                    *("--config", "/etc/cadence/trainer.json"),
                                    *("--host", "0.0.0.0", "--port", str(TRAINER_PORT)),
                                    *tls_args(pool),
                                ],
                                "ports": [{"name": "http", "containerPort": TRAINER_PORT}],
                                "env": [token_env(pool)],
                                "resources": pod_resources(t.resources, TRAINER_BASE),
                                "securityContext": CONTAINER_SECURITY,
                                "terminationMessagePolicy": "FallbackToLogsOnError",
                                "readinessProbe": probe(pool, "/healthz", "http"),
                                "volumeMounts": [
                                    {"name": "state", "mountPath": TRAINER_STATE},
                                    {"name": "config", "mountPath": "/etc/cadence"},
                                    *model_mounts(run),
                                    *tls_mounts(pool),
                                ],
                            },
                            *_calculator(run, pool, run.spec.trainer.image or pool.spec.image),
                        ],
                        "volumes": [
                            {"name": "config", "configMap": {"name": name}},
                            *model_volumes(run),
                            *tls_volumes(pool),
                        ],
                        "automountServiceAccountToken": False,
                        "securityContext": POD_SECURITY,
                        **placement,
                    },
                },
                # The ledger and weights go with the run unless it asks to keep them.
                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": kept, "whenScaled": kept},
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "state"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": t.storage}},
                        },
                    }
                ],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, **meta, "ownerReferences": refs},
            "spec": {
                "selector": selector,
                "ports": [
                    {"name": "http", "port": TRAINER_PORT, "targetPort": "http"},
                    *(
                        [{"name": "environment", "port": ENVIRONMENT_PORT}]
                        if run.spec.multi_turn.environment == "calculator"
                        else []
                    ),
                ],
            },
        },
    ]
    template = objects[1]["spec"]["template"]
    overlaid(template["metadata"], template["spec"], t.template)
    return objects
