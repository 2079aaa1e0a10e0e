"""The Kubernetes side: `cadence operator` (the kopf operator) and `cadence crds` (the
CustomResourceDefinitions generated from the resource models).

kopf and the Kubernetes client are imported inside the commands, so that nothing else
needs them installed or waits for them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cadence.cli.common import Commands, RunFailed, UsageError, at_least, positive_seconds


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
        )
    except CredentialsError as e:
        raise UsageError(str(e)) from None
    if not led:
        raise RunFailed("lost leadership (the Lease); restart to stand by again")
    return 0


def _cmd_crds(args: argparse.Namespace) -> int:
    from cadence.operator.kube import crds  # noqa: PLC0415

    if args.check:
        stale = [
            name
            for name, text in crds.rendered().items()
            if not (args.out / name).is_file() or (args.out / name).read_text() != text
        ]
        if stale:
            raise RunFailed(f"{args.out} is stale ({', '.join(stale)}); run cadence crds")
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
