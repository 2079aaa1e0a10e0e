"""The Kubernetes side: `cadence operator` (the kopf operator) and `cadence crds` (the
CustomResourceDefinitions generated from the resource models).

kopf and the Kubernetes client are imported inside the commands, so that nothing else
needs them installed or waits for them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cadence.cli.common import (
    Commands,
    RunFailed,
    UsageError,
    at_least,
    check_generated,
    positive_seconds,
)


def _cmd_operator(args: argparse.Namespace) -> int:
    if args.all_namespaces == bool(args.namespace):
        raise UsageError("give --all-namespaces or one or more --namespace")
    from cadence.operator.kube.credentials import CredentialsError  # noqa: PLC0415
    from cadence.operator.kube.serve import configure_logging, serve  # noqa: PLC0415

    if args.server is not None and (args.kubeconfig or args.context):
        raise UsageError("give --server or --kubeconfig/--context, not both")
    configure_logging(args.log_format, verbose=args.verbose)
    try:
        led = serve(
            namespaces=args.namespace or [],
            server=args.server,
            metrics_port=args.metrics_port,
            health_port=args.health_port,
            resync_s=args.resync_s,
            leader_elect=args.leader_elect,
            lease_namespace=args.lease_namespace,
            scrapers_namespace=args.prometheus_namespace,
            kubeconfig=args.kubeconfig,
            context=args.context,
            trace_dir=args.trace_dir,
        )
    except CredentialsError as e:
        raise UsageError(str(e)) from None
    if not led:
        raise RunFailed("lost leadership (the Lease); restart to stand by again")
    return 0


def _cmd_crds(args: argparse.Namespace) -> int:
    from cadence.operator.kube import crds  # noqa: PLC0415

    if args.check:
        check_generated(crds.rendered(), args.out, "crds")
        return 0
    for path in crds.write(args.out):
        print(path)
    return 0


def add_operator(sub: Commands) -> None:
    """`cadence operator`."""
    op = sub.add_parser(
        "operator",
        help="run the Kubernetes operator (kopf): pools, groups and runs reconciled",
        description="Reconcile RolloutPools, RolloutGroups and TrainingRuns: worker pods "
        "per group, the trainer per run, statuses and Events. In a pod it uses the service "
        "account; --server points it at another API server.",
    )
    op.add_argument("--namespace", action="append", help="watch this namespace (repeatable)")
    op.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    op.add_argument(
        "--server", help="an API server URL, no credentials (a local emulator, kubectl proxy)"
    )
    op.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: $KUBECONFIG)")
    op.add_argument("--context", help="the kubeconfig context (default: its current one)")
    op.add_argument("--metrics-port", type=at_least(1), default=9090)
    op.add_argument("--health-port", type=at_least(1), default=8080)
    op.add_argument(
        "--resync-s",
        type=positive_seconds,
        default=5.0,
        help="reconcile every object at least this often, seconds (default 5): what "
        "notices changes no handler is called for (a pool released, a pod gone)",
    )
    op.add_argument(
        "--leader-elect",
        action="store_true",
        help="elect one leader among replicas through a Lease; the others stand by",
    )
    op.add_argument(
        "--lease-namespace",
        help="the Lease's namespace (default: the pod's own, else default)",
    )
    op.add_argument(
        "--prometheus-namespace",
        default="monitoring",
        help="the namespace whose pods may scrape workers' /metrics (default monitoring); "
        "workers take control calls only from the operator, their trainer and each other",
    )
    op.add_argument(
        "--trace-dir",
        type=Path,
        help="write each TrainingRun's trace here, as NAMESPACE/RUN-UID.jsonl, for cadence "
        "sim --trace (a volume of the operator's pod; default: no traces)",
    )
    op.add_argument(
        "--log-format",
        choices=["full", "json"],
        default="full",
        help="log lines with time, logger and level (full), or one JSON object each",
    )
    op.add_argument("--verbose", action="store_true", help="log at DEBUG, not INFO")
    op.set_defaults(run=_cmd_operator)


def add_crds(sub: Commands) -> None:
    """`cadence crds`."""
    cr = sub.add_parser(
        "crds",
        help="write the CustomResourceDefinitions generated from the resource models",
        description="Write the CRDs of RolloutPool, RolloutGroup and TrainingRun, generated "
        "from the pydantic models cadence run validates with, into --out.",
    )
    cr.add_argument("--out", type=Path, default=Path("crds"), help="folder (default: crds)")
    cr.add_argument("--check", action="store_true", help="exit 1 if --out differs; write nothing")
    cr.set_defaults(run=_cmd_crds)


def _claims(given: list[str]) -> dict[str, Path]:
    claims = {}
    for item in given:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            raise UsageError(f"--claim {item!r} is not NAME=FOLDER")
        if not Path(folder).is_dir():
            raise UsageError(f"--claim {name}: {folder} is not a folder")
        claims[name] = Path(folder).resolve()
    return claims


def _tiny_model(folder: Path) -> Path:
    """The claim `models` by default: a tiny random-weight Llama, made once."""
    try:
        from cadence.worker.tinymodel import make_tiny_llama  # noqa: PLC0415
    except ImportError:
        raise UsageError(
            "the default claim `models` is a tiny Llama made here, which needs the cpu "
            "extra (pip install 'cadence[cpu]'); or give --claim models=FOLDER"
        ) from None
    if not (folder / "config.json").is_file():
        print(f"making a tiny Llama in {folder} (the claim `models`)")
        make_tiny_llama(folder)
    return folder


def _cmd_dev_cluster(args: argparse.Namespace) -> int:
    claims = _claims(args.claim or [])
    try:
        from cadence.devcluster import cluster  # noqa: PLC0415
    except ModuleNotFoundError as e:
        if (e.name or "").startswith("cadence"):
            raise
        raise UsageError(
            f"cadence dev cluster needs the dev extra ({e.name} is missing): "
            "pip install 'cadence[dev]'"
        ) from None
    from cadence.operator.kube.serve import configure_logging  # noqa: PLC0415

    node = not args.no_node
    if node and not cluster.node_available():
        raise UsageError(
            "the node runs pods in network namespaces, which needs root, iproute2 and "
            "unshare; give --no-node to run without one (pods then stay Pending)"
        )
    if node and "models" not in claims:
        claims["models"] = _tiny_model(args.workdir.resolve() / "models")
    configure_logging("full", verbose=args.verbose)
    dev = cluster.DevCluster(
        workdir=args.workdir.resolve(),
        port=args.port,
        namespaces=args.namespace or ["default"],
        node=node,
        claims=claims,
    )
    dev.run(say=print)
    return 0


def add_dev(sub: Commands) -> None:
    """`cadence dev cluster`."""
    dev = sub.add_parser(
        "dev",
        help="tools for developing and trying Cadence",
        description="Tools for developing and trying Cadence.",
    )
    tools = dev.add_subparsers(dest="tool", required=True, metavar="TOOL")
    cl = tools.add_parser(
        "cluster",
        help="a Kubernetes API, a node and the operator on this machine, for kubectl",
        description="Serve an in-memory Kubernetes API with Cadence's CRDs, a node that runs "
        "pods as local processes, and the operator, until Ctrl-C. Point kubectl at the "
        "kubeconfig it writes and apply a pool and a run (docs/dev-cluster.md).",
    )
    cl.add_argument(
        "--workdir",
        type=Path,
        default=Path("runs/dev-cluster"),
        help="the kubeconfig, pods' logs and volumes (default runs/dev-cluster)",
    )
    cl.add_argument(
        "--port", type=at_least(0), default=0, help="the API server's port (default: a free one)"
    )
    cl.add_argument("--namespace", action="append", help="watch this namespace (repeatable)")
    cl.add_argument(
        "--claim",
        action="append",
        metavar="NAME=FOLDER",
        help="serve the PersistentVolumeClaim NAME from FOLDER (a run's pvc://NAME weights; "
        "default: models from a tiny Llama made in WORKDIR/models)",
    )
    cl.add_argument(
        "--no-node", action="store_true", help="run no pods (no root needed); they stay Pending"
    )
    cl.add_argument("--verbose", action="store_true", help="log the operator at DEBUG")
    cl.set_defaults(run=_cmd_dev_cluster)
