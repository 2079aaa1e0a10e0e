"""`cadence plan` and `cadence sim`: the scheduling policies run offline, on files.

`plan` runs one control cycle on a snapshot JSON file; `sim` runs a whole rollout pool in
the discrete-event simulator under each policy. Most of this module is what turns a
scenario file that cannot be read into one sentence (YAML positions, pydantic paths,
--set overrides), the progress display and the --vary/--sweep comparisons.
`cadence bench workload` reads scenarios with load_scenario too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from cadence.cli.common import (
    Commands,
    UsageError,
    output_file,
    read_json,
    setting_value,
    validation_sentence,
)
from cadence.common.inputs import read_input
from cadence.common.trace import Trace, TraceError
from cadence.common.trace import read as read_trace
from cadence.scheduler import plan
from cadence.scheduler.registry import DEFAULT_POLICIES, POLICIES
from cadence.scheduler.snapshot import Migration
from cadence.scheduler.wire import SnapshotModel, StateModel, actions_to_json
from cadence.sim import compare
from cadence.sim.frontier import frontier
from cadence.sim.records import Result
from cadence.sim.replay import Replay, ReplayError, replay
from cadence.sim.report import document, pool_lines, table
from cadence.sim.scenario import Scenario

R = TypeVar("R")


def _cmd_plan(args: argparse.Namespace) -> int:
    raw = read_json(args.snapshot, "snapshot")
    try:
        snapshot = SnapshotModel.model_validate(raw).to_snapshot()
    except ValidationError as e:
        raise UsageError(validation_sentence("snapshot", args.snapshot, e)) from None
    state = StateModel()
    if args.state is not None:
        try:
            state = StateModel.model_validate(read_json(args.state, "state"))
        except ValidationError as e:
            raise UsageError(validation_sentence("state", args.state, e)) from None
    actions, new_state = plan(snapshot, state.to_state())
    print(
        json.dumps(
            {"actions": actions_to_json(actions), "state": StateModel.of(new_state).model_dump()},
            indent=2 if args.pretty else None,
        )
    )
    return 0


def _policy_settings(items: Sequence[str]) -> dict[str, dict[str, object]]:
    """`--param laminar.decode_batch_bound=64` -> {"laminar": {"decode_batch_bound": 64}}."""
    settings: dict[str, dict[str, object]] = {}
    for item in items:
        name, dot, rest = item.partition(".")
        key, eq, value = rest.partition("=")
        if not (dot and eq and key):
            raise UsageError(f"--param {item!r} is not POLICY.KEY=VALUE")
        settings.setdefault(name, {})[key] = setting_value(value)
    return settings


def load_scenario(
    path: Path, settings: Sequence[str] = (), scenario: Scenario | None = None
) -> Scenario:
    """A scenario file, or the resources `cadence run` takes (`operator/api/simulate.py`),
    with `--set PATH=VALUE` overrides applied (to `scenario` instead, where given)."""
    scenario = scenario or _read_scenario(path)
    for item in settings:
        key, eq, value = item.partition("=")
        if not (eq and key):
            raise UsageError(f"--set {item!r} is not PATH=VALUE (e.g. trainer.update_seconds=2)")
        try:
            scenario = compare.with_setting(scenario, key, setting_value(value))
        except compare.UnknownSetting as e:
            raise UsageError(str(e)) from None
        except ValidationError as e:
            raise UsageError(
                validation_sentence(f"--set {item}: scenario", path, e, Scenario)
            ) from None
    return scenario


def _read_scenario(path: Path) -> Scenario:
    if _holds_resources(path):
        from cadence.operator.api.files import load  # noqa: PLC0415
        from cadence.operator.api.resources import ResourceError  # noqa: PLC0415
        from cadence.operator.api.simulate import scenario_of, with_autoscaling  # noqa: PLC0415

        try:
            pool, run = load(path)
            return with_autoscaling(scenario_of(pool, run), pool)
        except ResourceError as e:
            raise UsageError(str(e)) from None
        except ValidationError as e:
            raise UsageError(validation_sentence("pool's autoscaling", path, e, Scenario)) from None
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
        raise UsageError(validation_sentence("scenario", path, e, Scenario)) from None


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
        docs = list(yaml.safe_load_all(read_input(path).decode("utf-8")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return False  # the scenario reader says why
    return any(isinstance(d, dict) and "apiVersion" in d for d in docs)


def _vary_values(spec: str) -> tuple[str, list[object]]:
    path, eq, listed = spec.partition("=")
    values = [setting_value(v) for v in listed.split(",") if v.strip()]
    if not (eq and path and values):
        raise UsageError(f"--vary {spec!r} is not FIELD=V1,V2,... (e.g. scheduling.eta=1,2,3)")
    return path, values


def _eta_beyond_reach(scenario: Scenario, path: str, values: Sequence[object]) -> str | None:
    """When some values of a `--vary` over eta cannot differ: a sample is at most
    iterations - 1 versions old when trained, so every eta from there on runs alike."""
    if path != "scheduling.eta":
        return None
    cap = scenario.workload.iterations - 1
    alike = [v for v in values if isinstance(v, int) and v >= cap]
    if len(alike) < 2:
        return None
    listed = ", ".join(str(v) for v in alike)
    return (
        f"eta {listed} cannot differ: with {cap + 1} iterations no sample is trained more "
        f"than {cap} versions after it was generated; raise workload.iterations to compare them"
    )


def _compare(scenario_file: Path, name: str, call: Callable[[], R]) -> tuple[R, dict[str, float]]:
    """Run a comparison, turning refused settings into usage errors; time it in wall and
    CPU seconds (user + system, this process and the runs' worker processes)."""
    start, cpu = time.perf_counter(), _cpu_seconds()
    try:
        out = call()
    except compare.UnknownSetting as e:
        raise UsageError(str(e)) from None
    except ValidationError as e:
        raise UsageError(validation_sentence("scenario", scenario_file, e, Scenario)) from None
    wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    print(f"{name}: {wall:.1f} s of wall time, {cpu:.1f} s of CPU")
    return out, {"wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 3)}


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class _LineProgress:
    """Progress for logs and pipes: a line as each run starts."""

    def run_started(self, label: str, batches: int) -> Callable[[int, float], None]:
        print(f"  running {label}", file=sys.stderr, flush=True)
        return lambda consumed, simulated_s: None


class _BarProgress:
    """Progress on a terminal: a rich bar per run, counting batches consumed; a run's
    bar goes when the run ends."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar

    def run_started(self, label: str, batches: int) -> Callable[[int, float], None]:
        task = self.bar.add_task(label, total=batches, sim="0")

        def consumed(done: int, simulated_s: float) -> None:
            self.bar.update(task, completed=done, sim=f"{simulated_s:,.0f}")
            if done >= batches:
                self.bar.update(task, visible=False)

        return consumed


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


def replayed(path: Path) -> tuple[Scenario, Trace, Replay]:
    """The scenario a run trace describes, and the trace (`sim/replay.py`)."""
    try:
        trace = read_trace(path)
        found = replay(trace)
    except OSError as e:
        raise UsageError(f"cannot read trace {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UsageError(f"trace {path} is not UTF-8 text") from None
    except (TraceError, ReplayError) as e:
        raise UsageError(str(e)) from None
    except ValidationError as e:
        raise UsageError(validation_sentence("trace's scenario", path, e, Scenario)) from None
    return found.scenario, trace, found


def _fit_line(fit: dict[str, Any]) -> str:
    f = fit["fitted"]
    return (
        f"step model of {fit['accelerator']}: bandwidth efficiency "
        f"{f['bandwidth_efficiency']:.4g} and overhead {f['step_overhead_s'] * 1000:.3g} ms, "
        f"fitted to {fit['samples']} samples ({fit['steps']} steps); error "
        f"{fit['error_pct']:.1f}% (the scenario's model: {fit['error_before_pct']:.1f}%)"
    )


def _against_run(trace: Trace, results: Sequence[Result]) -> dict[str, Any]:
    """The replay of the trace's own policy beside the run's figures."""
    run, mine = trace.summary, [r for r in results if r.policy == trace.header.policy]
    if run is None or not mine or not run.throughput_tok_s:
        return {}  # nothing to compare with: a run that ended early, or another policy
    sim = mine[0]
    ratio = {"throughput_tok_s": round(sim.throughput_tok_s / run.throughput_tok_s, 3)}
    if run.latency_p95_s:
        ratio["latency_p95_s"] = round(sim.latency_p95_s / run.latency_p95_s, 3)
    print(
        f"replay of {trace.header.policy}: {sim.throughput_tok_s:,.1f} tok/s, P95 "
        f"{sim.latency_p95_s:.1f} s; the run: {run.throughput_tok_s:,.1f} tok/s, P95 "
        f"{run.latency_p95_s or 0:.1f} s (replay / run: {ratio['throughput_tok_s']:.3f} and "
        f"{ratio.get('latency_p95_s', float('nan')):.3f})"
    )
    return {
        "policy": trace.header.policy,
        "run": {"throughput_tok_s": run.throughput_tok_s, "latency_p95_s": run.latency_p95_s},
        "ratio": ratio,
    }


def _cmd_sim(args: argparse.Namespace) -> int:
    if (args.scenario is None) == (args.trace is None):
        raise UsageError("give either --scenario FILE or --trace FILE")
    traced: tuple[Scenario, Trace, Replay] | None = None
    if args.trace is not None:
        traced = replayed(args.trace)
        scenario = load_scenario(args.trace, args.set or (), scenario=traced[0])
        args.scenario = args.trace
        if args.policies is None:
            args.policies = traced[1].header.policy
    else:
        scenario = load_scenario(args.scenario, args.set or ())
    if args.policies is None:
        args.policies = ",".join(DEFAULT_POLICIES)
    if args.write_scenario is not None:
        body = scenario.model_dump(mode="json", exclude_unset=True)
        args.write_scenario.write_text(yaml.safe_dump(body, sort_keys=False))
        print(f"wrote {args.write_scenario}")
    if args.seed is not None:
        scenario = scenario.model_copy(update={"seed": args.seed})
    if args.migration is not None:
        scheduling = scenario.scheduling.model_copy(update={"migration": args.migration})
        scenario = scenario.model_copy(update={"scheduling": scheduling})
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise UsageError(
            f"unknown policy {', '.join(unknown) or '(none)'}; available: {', '.join(POLICIES)}"
        )
    settings = _policy_settings(args.param or [])
    if args.jobs < 1:
        raise UsageError(f"--jobs is {args.jobs}; it must be at least 1")
    if args.frontier and ("cadence" not in names or len(names) < 2):
        raise UsageError("--frontier compares cadence with other policies: name both in --policies")
    sweep = args.sweep or args.frontier

    out = Console(width=None if sys.stdout.isatty() else 120)
    for line in pool_lines(scenario.deployments()):
        print(line)
    if traced is not None:
        for fit in traced[2].summary()["step_fits"]:
            print(_fit_line(fit))
    for warning in scenario.floor_warnings():
        print(f"warning: {warning}", file=sys.stderr)
    if args.vary is not None:
        path, values = _vary_values(args.vary)
        note = _eta_beyond_reach(scenario, path, values)
        if note is not None:
            print(f"note: {note}", file=sys.stderr)
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
                    sweep=sweep,
                    progress=progress,
                    jobs=args.jobs,
                ),
            )
        entries = {
            str(v): document(scenario.name, {}, rs)["policies"] for v, rs in by_value.items()
        }
        verdicts = {v: frontier(e).to_json() for v, e in entries.items()} if args.frontier else {}
        for value, rows in by_value.items():
            out.print(table(rows, f"{path} = {value}"))
            if args.frontier:
                print(f"frontier: {verdicts[str(value)]['verdict']}")
        if args.json is not None:
            doc: dict[str, Any] = {"scenario": scenario.name, **timing, "vary": path}
            doc["values"] = entries
            if args.frontier:
                doc["frontier"] = verdicts
            args.json.write_text(json.dumps(doc, indent=2) + "\n")
        if args.plots is not None:
            args.plots.mkdir(parents=True, exist_ok=True)
            from cadence.sim import plots  # noqa: PLC0415 (matplotlib: half a second)

            print(f"wrote {plots.knob_sweep(path, by_value, args.plots / f'sweep_{path}.png')}")
            drawn = plots.frontier(path, by_value, args.plots / f"frontier_{path}.png")
            print(f"wrote {drawn}")
        return 0

    trace = scenario.traced_sample() if args.plots is not None else None
    with _progress() as progress:
        results, timing = _compare(
            args.scenario,
            scenario.name,
            lambda: compare.run(
                scenario,
                names,
                settings,
                sweep=sweep,
                progress=progress,
                trace=trace,
                jobs=args.jobs,
            ),
        )
    out.print(table(results, scenario.name))
    doc = document(scenario.name, timing, results, scenario.deployments())
    if traced is not None:
        doc["trace"] = {**traced[2].summary(), **_against_run(traced[1], results)}
    policies: dict[str, Any] = doc["policies"]
    if args.frontier:
        doc["frontier"] = frontier(policies).to_json()
        print(f"frontier: {doc['frontier']['verdict']}")
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if args.plots is not None:
        from cadence.sim import plots  # noqa: PLC0415 (matplotlib: half a second)

        for path_written in plots.write_all(results, args.plots):
            print(f"wrote {path_written}")
    return 0


def add_plan(sub: Commands) -> None:
    """`cadence plan SNAPSHOT`."""
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


def add_sim(sub: Commands) -> None:
    """`cadence sim --scenario FILE`."""
    s = sub.add_parser(
        "sim",
        help="simulate a rollout pool under one or more policies",
        description="Simulate a rollout pool described by a scenario file under each "
        "policy and print a table (and optionally JSON).",
    )
    s.add_argument(
        "--scenario",
        type=Path,
        help="scenario YAML file, or the RolloutPool and TrainingRun file cadence run takes",
    )
    s.add_argument(
        "--trace",
        type=Path,
        help="replay a run's trace (trace.jsonl): its pool and knobs, with the lengths, "
        "tool latencies and update times it recorded and each accelerator type's step "
        "model fitted to its measured steps; instead of --scenario",
    )
    s.add_argument(
        "--write-scenario",
        type=output_file,
        metavar="FILE",
        help="also write the scenario that runs (after --trace and --set) as YAML here, "
        "to edit and run with --scenario",
    )
    s.add_argument(
        "--set",
        action="append",
        metavar="PATH=VALUE",
        help="set a scenario field (e.g. workload.prompt_tokens=64); repeatable",
    )
    s.add_argument(
        "--policies",
        help=f"comma-separated names, of {', '.join(POLICIES)} (default: all but the "
        "variants; with --trace, the traced run's)",
    )
    s.add_argument("--seed", type=int, help="override the scenario's seed")
    s.add_argument(
        "--migration",
        choices=get_args(Migration),
        help="how a departed trajectory moves: auto (pull its KV where the pair's layouts "
        "match, else re-prefill), kv (only where it can be pulled), reprefill (never "
        "pull); overrides the scenario's scheduling.migration",
    )
    s.add_argument("--json", type=output_file, help="write the results as JSON here")
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
    s.add_argument(
        "--frontier",
        action="store_true",
        help="say whether another policy beats Cadence on both throughput and P95 at "
        "equal staleness, and which (sweeps the baselines; needs cadence and a baseline)",
    )
    s.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="runs at once, each in its own process (default: one per core; the results "
        "are the same as one at a time)",
    )
    s.set_defaults(run=_cmd_sim)
