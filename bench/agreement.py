"""Agreement bench: the emulated runtime (`cadence run`) and the simulator (`cadence sim`)
on one scenario, the same YAML file; how far their throughput and P95 latency differ.

For each policy the file runs for real first: trainer, emulated workers and the control
loop, at a time compression slow enough for the emulation to keep its accelerators' pace
on this machine. What the resources do not say about the workload is then read from that
run's ledger and its control loop (mean prompt and response length, the mean update
time, the mean time a worker's advance took) and given to the simulator
(`operator/api/simulate.py`), which runs the same policy on the same modelled pool and
charges each advance what the run's did.
`ratio` is runtime over simulator; the target is within 15%.

The run's trace is replayed too (`cadence sim --trace`, `sim/replay.py`): the lengths and
update times it recorded and each accelerator type's step model fitted to its steps, in
place of the means. `replay.ratio` is replay over runtime, and the fits' errors are
beside it. Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import statistics
import tempfile
from pathlib import Path

from cadence.common.trace import read as read_trace
from cadence.operator.api.files import load
from cadence.operator.api.simulate import FREE_LINK_GB_S, SimWorkload, scenario_of
from cadence.operator.local import run as local
from cadence.sim import compare
from cadence.sim.replay import replay

EXAMPLE = Path(__file__).parents[1] / "manifests" / "examples" / "trainingrun.yaml"


def _workload(state_dir: Path, compression: float, advance_s: float | None) -> SimWorkload:
    db = sqlite3.connect(state_dir / "ledger.db")
    try:
        prompts = [len(json.loads(p)) for (p,) in db.execute("SELECT prompt FROM groups")]
        (tokens,) = db.execute("SELECT AVG(tokens) FROM arrivals WHERE outcome = 'accepted'")
        updates = [json.loads(s)["seconds"] for (s,) in db.execute("SELECT stats FROM updates")]
    finally:
        db.close()
    return SimWorkload(
        prompt_tokens=round(statistics.mean(prompts)),
        response_tokens=float(tokens[0]),
        update_seconds=statistics.mean(updates),
        compression=compression,
        weights_link_gb_s=FREE_LINK_GB_S,
        advance_seconds=advance_s,
    )


def measure(
    file: Path, policies: list[str], compression: float, iterations: int, workdir: Path
) -> dict[str, object]:
    pool, training = load(file)
    spec = training.spec.model_copy(
        update={"batch": training.spec.batch.model_copy(update={"iterations": iterations})}
    )
    training = training.model_copy(update={"spec": spec})
    out: dict[str, object] = {}
    for policy in policies:
        folder = workdir / policy
        options = local.RunOptions(policy=policy, compression=compression)
        measured = asyncio.run(local.run(pool, training, folder, options)).measures
        advance_s = measured["advance_s_mean"]
        assert advance_s is None or isinstance(advance_s, float)
        workload = _workload(folder / "trainer", compression, advance_s)
        simulated = compare.run(scenario_of(pool, training, workload), [policy], {})[0]
        runtime = {
            "throughput_tok_s": measured["throughput_tok_s"],
            "latency_p95_s": measured["latency_p95_s"],
            "wall_seconds": measured["wall_seconds"],
        }
        sim = {
            "throughput_tok_s": round(simulated.throughput_tok_s, 1),
            "latency_p95_s": round(simulated.latency_p95_s, 3),
            "simulated_seconds": round(simulated.simulated_seconds, 1),
        }
        ratio = {
            k: round(float(runtime[k]) / sim[k], 3) if sim[k] else None  # type: ignore[arg-type]
            for k in ("throughput_tok_s", "latency_p95_s")
        }
        replayed = replay(read_trace(folder / "trace.jsonl"))
        again = compare.run(replayed.scenario, [policy], {})[0]
        replay_figures = {
            "throughput_tok_s": round(again.throughput_tok_s, 1),
            "latency_p95_s": round(again.latency_p95_s, 3),
        }
        replay_ratio = {
            k: round(v / float(runtime[k]), 3) if runtime[k] else None  # type: ignore[arg-type]
            for k, v in replay_figures.items()
        }
        out[policy] = {
            "runtime": runtime,
            "simulator": sim,
            "ratio": ratio,
            "within_15pct": all(r is not None and abs(r - 1) <= 0.15 for r in ratio.values()),
            "replay": {
                **replay_figures,
                "ratio": replay_ratio,
                "within_15pct": all(
                    r is not None and abs(r - 1) <= 0.15 for r in replay_ratio.values()
                ),
                "step_fits": [f.summary() for f in replayed.fits],
            },
            "workload": {
                "prompt_tokens": workload.prompt_tokens,
                "response_tokens": round(workload.response_tokens or 0, 2),
                "update_seconds": round(workload.update_seconds, 3),
                "advance_seconds": workload.advance_seconds,
            },
        }
    return {"file": str(file), "compression": compression, "iterations": iterations, **out}


def main(
    file: Path | None, policies: list[str], compression: float, iterations: int
) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="cadence-agreement-") as tmp:
        result = measure(file or EXAMPLE, policies, compression, iterations, Path(tmp))
    print(json.dumps(result), flush=True)
    return result
