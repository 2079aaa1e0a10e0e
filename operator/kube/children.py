"""The Kubernetes objects the operator owns, as pure functions of the resources: a pool's
RolloutGroups, its headless Service, token Secret and its workers' NetworkPolicy; a
group's worker pods; a run's trainer ConfigMap, StatefulSet and Service. No I/O here:
the kopf handlers (`operator/kube/handlers.py`) compare these with what exists and
create, patch or delete.

Worker pods are made by the operator rather than a Deployment so that scale-in can pick
which pod goes (`scale_in_order`), as KubeRay's `workersToDelete` does: never the last
worker of a version with unfinished work; among the rest, a concentration source first,
then the emptiest.

Every service a pool runs (workers, the trainer, the reference environment) takes the
pool's bearer token from its Secret. A pool that names a TLS Secret (`spec.tlsSecret`: a
kubernetes.io/tls Secret with `ca.crt`, as cert-manager makes one) has them serve HTTPS
with it, probed over HTTPS, and its workers trust its `ca.crt` (`CADENCE_CA_FILE`) when
they call peers, the trainer and the environment. A worker is then reached by its name
under the pool's headless Service, which a certificate can name, rather than by its IP
(`pod_url`); manifests/examples/tls.yaml has a Certificate that covers them all.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import secrets
from collections.abc import Mapping
from typing import Any

from cadence.operator.api.capacity import group_plans
from cadence.operator.api.resources import (
    PodOverlay,
    RolloutGroup,
    RolloutPool,
    TrainingRun,
    groups_of,
)

CONTROL_PORT = 8000
TRAINER_PORT = 8100
ENVIRONMENT_PORT = 8200  # the reference calculator, beside the trainer
TOKEN_KEY = "token"
DRAIN_GRACE_S = 60  # a worker drains (hands its parked work back) within this
TRAINER_STATE = "/var/lib/cadence"
TLS_DIR = "/etc/cadence-tls"  # the pool's TLS Secret: tls.crt, tls.key, ca.crt (not under
# /etc/cadence, the trainer's ConfigMap: a mount inside a ConfigMap's is fragile)
MODELS_DIR = "/models"
WEIGHTS_DIR = "/var/cache/cadence/weights"  # a worker's store of the versions it advanced to
# KV-cache migration between a pool's vLLM workers (vLLM's NixlConnector): the NIXL side
# channel, where a destination asks the source for its blocks' layout (vLLM's default
# VLLM_NIXL_SIDE_CHANNEL_PORT), and the ports UCX's TCP transport listens on for the
# blocks themselves (pinned with UCX_TCP_PORT_RANGE; see `worker_policy`). Below the
# kernel's ephemeral range (32768-60999), so no outgoing connection takes one of them.
KV_TRANSFER_PORT = 5600
KV_DATA_PORTS = (5601, 5999)


def owner(obj: Mapping[str, Any], *, controller: bool = True) -> dict[str, Any]:
    """An ownerReference to `obj` (a dict as the API server returns it)."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def labels(pool: str, component: str, **extra: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": f"cadence-{component}",
        "app.kubernetes.io/instance": pool,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "cadence",
        "app.kubernetes.io/managed-by": "cadence-operator",
        "cadence.dev/pool": pool,
        **extra,
    }


def worker_selector(pool: str) -> dict[str, str]:
    """The labels of a pool's worker pods. The pool's label alone also selects its run's
    trainer pod, which answers on the workers' port: the control loop took it for a worker
    and, finding no worker API there, for a lost one."""
    return {"cadence.dev/pool": pool, "app.kubernetes.io/component": "worker"}


def group_selector(group: RolloutGroup) -> str:
    """The label selector of a group's pods, as /scale reports it."""
    return f"cadence.dev/pool={group.spec.pool},cadence.dev/group={group.spec.group}"


def disruption_budget(group: RolloutGroup, group_obj: Mapping[str, Any]) -> dict[str, Any]:
    """A PodDisruptionBudget per group: a node drain evicts its workers one at a time,
    each through its own drain (SIGTERM), never the whole group at once."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": group.metadata.name,
            "namespace": group.metadata.namespace,
            "labels": labels(group.spec.pool, "worker"),
            "ownerReferences": [owner(group_obj)],
        },
        "spec": {
            "maxUnavailable": 1,
            "selector": {
                "matchLabels": {
                    "cadence.dev/pool": group.spec.pool,
                    "cadence.dev/group": group.spec.group,
                }
            },
        },
    }


def rollout_groups(pool: RolloutPool, pool_obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pool's RolloutGroups, owned by it; created once, never overwritten (their
    `replicas` is theirs after that)."""
    out = []
    for g in groups_of(pool):
        body = g.model_dump(by_alias=True, exclude_none=True, mode="json")
        body["metadata"]["ownerReferences"] = [owner(pool_obj)]
        body["metadata"]["labels"] = labels(pool.metadata.name, "group")
        out.append(body)
    return out


TEMPLATE_LABEL = "cadence.dev/template"  # a worker pod's template_hash


def group_drift(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that brings a RolloutGroup's spec to what its pool now says,
    leaving `replicas` (the group's own once made) as it is unless the new bounds
    exclude it; None removes a field."""
    keys = (set(current) | set(wanted)) - {"replicas"}
    drift = {k: wanted.get(k) for k in sorted(keys) if current.get(k) != wanted.get(k)}
    # New bounds the group's own count falls outside of (maxReplicas lowered below what
    # an autoscaler set): the count moves into them, or the group's rule refuses the patch.
    replicas = current.get("replicas")
    low, high = wanted.get("minReplicas", 0), wanted.get("maxReplicas", replicas)
    if drift and isinstance(replicas, int) and not low <= replicas <= high:
        drift["replicas"] = min(max(replicas, low), high)
    return drift


def template_hash(pod: Mapping[str, Any], overlay: PodOverlay | None = None) -> str:
    """What a worker pod runs, as a short hash: its spec without what names this one pod
    (hostname, --id), so every pod of one template hashes alike; and the labels and
    annotations a pod template overlay adds."""
    spec = copy.deepcopy(dict(pod["spec"]))
    spec.pop("hostname", None)
    for c in spec["containers"]:
        args = c.get("args", [])
        if "--id" in args:
            args[args.index("--id") + 1] = ""
    hashed: dict[str, Any] = spec
    if overlay is not None and (overlay.labels or overlay.annotations):
        hashed = {"spec": spec, "labels": overlay.labels, "annotations": overlay.annotations}
    text = json.dumps(hashed, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def headless_service(pool: RolloutPool, pool_obj: Mapping[str, Any]) -> dict[str, Any]:
    """Stable DNS for workers (`<pod>.<pool>-workers`), for peers pulling parked state."""
    name = pool.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{name}-workers",
            "namespace": pool.metadata.namespace,
            "labels": labels(name, "worker"),
            "ownerReferences": [owner(pool_obj)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # a draining worker still serves claims
            "selector": worker_selector(name),
            "ports": [{"name": "control", "port": CONTROL_PORT, "targetPort": "control"}],
        },
    }


def token_secret(pool: RolloutPool, pool_obj: Mapping[str, Any]) -> dict[str, Any]:
    """The pool's bearer token, made once (a fresh random value)."""
    token = base64.b64encode(secrets.token_hex(32).encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": pool.spec.token_secret,
            "namespace": pool.metadata.namespace,
            "labels": labels(pool.metadata.name, "token"),
            "ownerReferences": [owner(pool_obj)],
        },
        "type": "Opaque",
        "data": {TOKEN_KEY: token},
    }


# CPU and memory every pod asks for unless its spec names them: no BestEffort pods, which
# a node under pressure evicts first. Devices are requested and limited as given.
WORKER_BASE = {"cpu": "2", "memory": "8Gi"}
TRAINER_BASE = {"cpu": "2", "memory": "8Gi"}


# Restricted-compatible where the image allows it: no privilege escalation, no
# capabilities, the runtime's seccomp profile; no API token in pods that never call the
# API. (runAsNonRoot waits for an image that names a non-root user.)
# What the "restricted" Pod Security Standard asks of every pod and container; the image
# runs as user 10001, so runAsNonRoot holds without naming a user.
POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def tls_secret(pool: RolloutPool) -> str | None:
    """The Secret whose certificate the pool's services serve HTTPS with; None: HTTP.
    (Read with a default: `spec.tlsSecret` is optional.)"""
    name = getattr(pool.spec, "tls_secret", None)
    return str(name) if name else None


def scheme(pool: RolloutPool | None) -> str:
    return "https" if pool is not None and tls_secret(pool) else "http"


def token_env(pool: RolloutPool) -> dict[str, Any]:
    return {
        "name": "CADENCE_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": pool.spec.token_secret, "key": TOKEN_KEY}},
    }


def tls_args(pool: RolloutPool) -> list[str]:
    if not tls_secret(pool):
        return []
    return ["--tls-cert", f"{TLS_DIR}/tls.crt", "--tls-key", f"{TLS_DIR}/tls.key"]


def _ca_env(pool: RolloutPool) -> list[dict[str, Any]]:
    """Where a pod's clients find the CA to verify the pool's services with."""
    return [{"name": "CADENCE_CA_FILE", "value": f"{TLS_DIR}/ca.crt"}] if tls_secret(pool) else []


def tls_volumes(pool: RolloutPool) -> list[dict[str, Any]]:
    name = tls_secret(pool)
    return [{"name": "tls", "secret": {"secretName": name}}] if name else []


def tls_mounts(pool: RolloutPool) -> list[dict[str, Any]]:
    return [{"name": "tls", "mountPath": TLS_DIR, "readOnly": True}] if tls_secret(pool) else []


STARTUP_CHECKS = 90  # a worker's start-up allowance, in 10 s probes: 15 minutes


def probe(pool: RolloutPool, path: str, port: str, **timing: int) -> dict[str, Any]:
    get: dict[str, Any] = {"path": path, "port": port}
    if tls_secret(pool):
        get["scheme"] = "HTTPS"
    return {"httpGet": get, **timing}


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's Ready condition is True (its readiness probe passes)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def crash_said(pod: Mapping[str, Any]) -> str | None:
    """Why a pod's container keeps exiting, in a clause, from its last termination (the
    message is the end of its log: `terminationMessagePolicy: FallbackToLogsOnError`);
    None while it has not exited."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        last = (c.get("lastState") or {}).get("terminated") or (c.get("state") or {}).get(
            "terminated"
        )
        if not last:
            continue
        lines = [line for line in str(last.get("message") or "").splitlines() if line.strip()]
        what = lines[-1].strip()[:300] if lines else last.get("reason") or "no message"
        code = last.get("exitCode")
        return (
            f"pod {pod['metadata']['name']} exited {c.get('restartCount', 0) + 1} time(s), "
            f"last with code {code}: {what}"
        )
    return None


def pod_url(pod: Mapping[str, Any]) -> str | None:
    """A worker pod's control URL; None until it has an IP. Over HTTP, its IP; over TLS
    (its worker serves a certificate), its name under the pool's headless Service
    (`<pod>.<pool>-workers.<namespace>.svc`), which the certificate names where it
    cannot name an IP."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    spec: Mapping[str, Any] = pod.get("spec") or {}
    containers = spec.get("containers") or [{}]
    if "--tls-cert" not in (containers[0].get("args") or []):
        return f"http://{ip}:{CONTROL_PORT}"
    namespace = pod["metadata"].get("namespace", "default")
    return f"https://{spec['hostname']}.{spec['subdomain']}.{namespace}.svc:{CONTROL_PORT}"


def kv_transfer(group: RolloutGroup, run: TrainingRun) -> bool:
    """Whether a group's workers take part in KV-cache migration: vLLM workers of a run
    that may move KV (`migration` auto or kv; reprefill never pulls a cache, so its
    workers open no port for one). Emulated workers have no cache to move."""
    return group.spec.engine.backend == "vllm" and run.spec.scheduler.migration != "reprefill"


def _kv_transfer_env() -> list[dict[str, Any]]:
    first, last = KV_DATA_PORTS
    return [{"name": "UCX_TCP_PORT_RANGE", "value": f"{first}-{last}"}]


def worker_policy(
    pool: RolloutPool,
    pool_obj: Mapping[str, Any],
    *,
    operator_namespace: str,
    scrapers_namespace: str,
) -> dict[str, Any]:
    """The NetworkPolicy of a pool's workers, in the pool's namespace: their control port
    (state, place, evict, claim, release, advance, weights; /metrics too) takes calls from
    the operator's pods (in `operator_namespace`), the pool's trainer and the pool's own
    workers, and scrapes from `scrapers_namespace` (Prometheus's); with vLLM groups, KV-cache
    migration (the NIXL side channel and UCX's TCP ports) only between the pool's workers.
    Nothing else reaches them. The operator makes it for every pool, wherever the pool
    lives: one policy installed beside the operator covered only the operator's namespace,
    and a pool elsewhere then had its control port closed by the KV policy alone.

    The blocks travel over NIXL's UCX backend. Over TCP (a pod network; RDMA transports
    bypass it and the policy) each UCX worker listens on a port per network interface
    (libuct's "tcp_iface ... listening for connections"), and the puller connects there.
    A NIXL agent made as vLLM makes it (nixl 1.5.1, num_threads=4) listened on 10 ports,
    kernel-picked (33441-59447 in one try); one agent per tensor-parallel rank. With
    UCX_TCP_PORT_RANGE (libuct's TCP_ PORT_RANGE: "Generate a random TCP port number
    from that range"), which `worker_pod` sets, all 10 were in it; UCX tries another
    port of the range while one is taken (5 per address fit a 6-port range; a 3-port
    range hung the agent's start), hence a wide range. So the policy opens that range,
    not all TCP. NIXL's own metadata listener is off in vLLM."""
    name = pool.metadata.name
    workers = {"matchLabels": worker_selector(name)}
    trainer = {"matchLabels": {"cadence.dev/pool": name, "app.kubernetes.io/component": "trainer"}}
    operator = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "cadence-operator"}},
    }
    control = [{"protocol": "TCP", "port": CONTROL_PORT}]
    ingress: list[dict[str, Any]] = [
        {"from": [operator, {"podSelector": trainer}, {"podSelector": workers}], "ports": control},
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": scrapers_namespace}
                    }
                }
            ],
            "ports": control,
        },
    ]
    if any(g.engine.backend == "vllm" for g in pool.spec.groups):
        first, last = KV_DATA_PORTS
        ingress.append(
            {
                "from": [{"podSelector": workers}],
                "ports": [
                    {"protocol": "TCP", "port": KV_TRANSFER_PORT},
                    {"protocol": "TCP", "port": first, "endPort": last},
                ],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{name}-workers",
            "namespace": pool.metadata.namespace,
            "labels": labels(name, "worker"),
            "ownerReferences": [owner(pool_obj)],
        },
        "spec": {"podSelector": workers, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def pod_resources(given: Mapping[str, int | str], base: Mapping[str, str]) -> dict[str, Any]:
    requests = {**base, **given}
    limits = {k: v for k, v in given.items() if k not in ("cpu", "memory")}
    out: dict[str, Any] = {"requests": requests}
    if limits:
        out["limits"] = limits
    return out


def worker_pod(
    pool: RolloutPool,
    group: RolloutGroup,
    group_obj: Mapping[str, Any],
    run: TrainingRun,
    index: int,
) -> dict[str, Any]:
    g, name = group.spec, pool.metadata.name
    pod = f"{group.metadata.name}-{index}"
    accelerator_labels = {
        "cadence.dev/group": g.group,
        "cadence.dev/accelerator": g.accelerator,
        "cadence.dev/affinity-rank": str(g.affinity),
        "cadence.dev/run": run.metadata.name,
    }
    args = [
        "worker",
        *("--id", pod, "--engine", g.engine.backend),
        *("--host", "0.0.0.0", "--port", str(CONTROL_PORT)),
        *("--accelerator", g.accelerator, "--affinity", str(g.affinity)),
        *("--model", run.spec.model.catalog, "--model-path", run.spec.model.in_pod(MODELS_DIR)),
        *("--max-model-len", str(g.engine.max_model_len), "--grace-s", str(DRAIN_GRACE_S - 10)),
        *("--trainer-url", trainer_url(run, pool)),
        *("--weights-dir", WEIGHTS_DIR),
        *("--memory-utilization", str(g.engine.memory_utilization)),
    ]
    # The degree capacity planning chose (the group's own, else the smallest that holds
    # the longest trajectory), so the worker holds the KV the operator planned with.
    tp, _ = group_plans(pool, run).get(g.group, (g.engine.tensor_parallel or 1, 0))
    args += ["--tensor-parallel", str(tp)]
    if g.engine.backend == "emulated":
        args += ["--compression", str(pool.spec.emulated_speed)]
    turns = run.spec.multi_turn
    url = environment_url(run, pool)
    if url is not None:
        args += ["--env-url", url, "--env-timeout-s", str(turns.timeout_s)]
        args += ["--env-tries", str(turns.tries)]
    args += tls_args(pool)
    ports = [{"name": "control", "containerPort": CONTROL_PORT}]
    env = [token_env(pool), *_ca_env(pool)]
    if kv_transfer(group, run):
        args += ["--kv-transfer-port", str(KV_TRANSFER_PORT)]
        ports.append({"name": "kv-transfer", "containerPort": KV_TRANSFER_PORT})
        env += _kv_transfer_env()
    spec: dict[str, Any] = {
        "hostname": pod,
        "subdomain": f"{name}-workers",
        "terminationGracePeriodSeconds": DRAIN_GRACE_S,
        "automountServiceAccountToken": False,
        "securityContext": POD_SECURITY,
        # vLLM's engine processes share tensors through /dev/shm, which a container
        # otherwise gets at 64 MiB.
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
            {"name": "weights", "emptyDir": {}},
            *model_volumes(run),
            *tls_volumes(pool),
        ],
        "containers": [
            {
                "name": "worker",
                "image": pool.spec.image,
                "args": args,
                "ports": ports,
                "env": env,
                "resources": pod_resources(g.resources, WORKER_BASE),
                "securityContext": CONTAINER_SECURITY,
                "terminationMessagePolicy": "FallbackToLogsOnError",  # why it exited
                "volumeMounts": [
                    {"name": "shm", "mountPath": "/dev/shm"},
                    {"name": "weights", "mountPath": WEIGHTS_DIR},
                    *model_mounts(run),
                    *tls_mounts(pool),
                ],
                # The worker builds its engine before it serves: a model's load and
                # warm-up may take minutes, and the liveness probe starts only after it.
                "startupProbe": probe(
                    pool, "/healthz", "control", periodSeconds=10, failureThreshold=STARTUP_CHECKS
                ),
                "readinessProbe": probe(pool, "/readyz", "control", periodSeconds=5),
                "livenessProbe": probe(
                    pool, "/healthz", "control", periodSeconds=10, failureThreshold=6
                ),
            }
        ],
    }
    if g.node_selector:
        spec["nodeSelector"] = dict(g.node_selector)
    if g.tolerations:
        spec["tolerations"] = [t.model_dump(exclude_none=True) for t in g.tolerations]
    out: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod,
            "namespace": group.metadata.namespace,
            "labels": labels(name, "worker", **accelerator_labels),
            "ownerReferences": [owner(group_obj)],
        },
        "spec": spec,
    }
    overlaid(out["metadata"], spec, g.template)
    out["metadata"]["labels"][TEMPLATE_LABEL] = template_hash(out, g.template)
    return out


# The pod fields an overlay sets outright (by their Kubernetes names).
_OVERLAY_FIELDS = (
    "affinity",
    "topologySpreadConstraints",
    "priorityClassName",
    "schedulerName",
    "serviceAccountName",
    "automountServiceAccountToken",
    "runtimeClassName",
)


def overlaid(meta: dict[str, Any], spec: dict[str, Any], overlay: PodOverlay) -> None:
    """`overlay` merged into a pod's metadata and spec, in place: labels and annotations
    under the operator's own, the placement and identity fields it gives, and its env,
    volumes and mounts after the operator's on the main container."""
    if overlay.labels:
        meta["labels"] = {**overlay.labels, **meta.get("labels", {})}
    if overlay.annotations:
        meta["annotations"] = {**overlay.annotations, **meta.get("annotations", {})}
    given = overlay.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
    for key in _OVERLAY_FIELDS:
        if key in given:
            spec[key] = copy.deepcopy(given[key])
    if overlay.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in overlay.image_pull_secrets]
    main = spec["containers"][0]
    if overlay.env:
        main["env"] = [*main.get("env", []), *copy.deepcopy(overlay.env)]
    if overlay.volume_mounts:
        main["volumeMounts"] = [
            *main.get("volumeMounts", []),
            *copy.deepcopy(overlay.volume_mounts),
        ]
    if overlay.volumes:
        spec["volumes"] = [*spec.get("volumes", []), *copy.deepcopy(overlay.volumes)]


def model_volumes(run: TrainingRun) -> list[dict[str, Any]]:
    """The claim `model.uri` names, read-only: workers and the trainer share it."""
    claim = run.spec.model.claim()
    if claim is None:
        return []
    return [{"name": "models", "persistentVolumeClaim": {"claimName": claim[0], "readOnly": True}}]


def model_mounts(run: TrainingRun) -> list[dict[str, Any]]:
    if run.spec.model.claim() is None:
        return []
    return [{"name": "models", "mountPath": MODELS_DIR, "readOnly": True}]


def trainer_name(run: TrainingRun) -> str:
    return f"{run.metadata.name}-trainer"


def trainer_url(run: TrainingRun, pool: RolloutPool | None = None) -> str:
    """The trainer's URL in the cluster (https when `pool` asks for TLS)."""
    host = f"{trainer_name(run)}.{run.metadata.namespace}.svc"
    return f"{scheme(pool)}://{host}:{TRAINER_PORT}"


def environment_url(run: TrainingRun, pool: RolloutPool | None = None) -> str | None:
    """Where workers call tools: the run's own URL, or for `calculator` the reference
    environment the trainer's pod runs beside the trainer (https when `pool` asks for
    TLS); None: single-turn."""
    env = run.spec.multi_turn.environment
    if env == "calculator":
        host = f"{trainer_name(run)}.{run.metadata.namespace}.svc"
        return f"{scheme(pool)}://{host}:{ENVIRONMENT_PORT}"
    return env
