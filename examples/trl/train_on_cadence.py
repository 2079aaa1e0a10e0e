"""Train a tiny model with TRL's AsyncGRPOTrainer on a Cadence pool, on one machine.

A Cadence run in external-trainer mode (its trainer service, emulated workers, the
control loop) serves as TRL's rollout backend: TRL's prompts go to the pool, whole
batches come back as TRL's rollout samples, and every update TRL makes is published to
the pool, whose workers advance to it. The task is the toy "write sevens" one (the
reward is the share of sevens in the first 16 characters), learnable by a random-weight
model in a few versions. The last line printed is JSON: the mean reward of each step.

    pip install -e ".[cpu,trl]"
    python examples/trl/train_on_cadence.py

or against the run `cadence run` makes of a TrainingRun with `dataset.task: external`
(the pool's groups as the file describes them; it writes where to connect):

    cadence run manifests/examples/trl.yaml --workdir runs/trl &
    python examples/trl/train_on_cadence.py --connect runs/trl/external.json

To train against a pool on Kubernetes instead, give the run's trainer Service
(`--url`, reached with `kubectl port-forward svc/NAME-trainer 8100`), its token
(`--token-file`) and where the pool fetches the weights this script writes
(`--weights-url`: an http(s) address serving `--work`/publish); the run must be a
TrainingRun with `dataset.task: external` and the same group size, batch and iterations.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from datasets import Dataset
from transformers import AutoTokenizer
from trl.experimental.async_grpo.async_grpo_config import AsyncGRPOConfig
from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer

from cadence.integrations.trl import (
    CadenceRolloutWorker,
    CadenceWeightTransfer,
    NoInvitation,
    agreeing,
    run_settings,
    wait_for_invitation,
)
from cadence.integrations.trl.cpu import CPU_SETTINGS, run_on_cpu
from cadence.operator.local.external import external_run
from cadence.trainer.config import TrainerConfig
from cadence.trainer.rewards import digits_reward
from cadence.worker.tinymodel import make_tiny_llama

GROUP, BATCH_GROUPS, MAX_TOKENS = 8, 4, 12


def sevens(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """TRL's reward-function signature: one score per completion."""
    return [digits_reward(c, a) for c, a in zip(completions, answer, strict=True)]


@contextlib.contextmanager
def local_pool(model: Path, work: Path, iterations: int, eta: int) -> Iterator[tuple[str, str]]:
    config = TrainerConfig(
        model_path=model,
        state_dir=work / "cadence",
        task="external",
        group_size=GROUP,
        batch_groups=BATCH_GROUPS,
        iterations=iterations,
        eta=eta,
        max_tokens=MAX_TOKENS,
        publish_from=work / "publish",
    )
    with external_run(config, token="local", logs=work) as run:
        yield run.url, run.token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--eta", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=0.02)
    parser.add_argument("--connect", type=Path, help="the external.json `cadence run` writes")
    parser.add_argument(
        "--wait-s", type=float, default=300.0, help="how long to wait for --connect's file"
    )
    parser.add_argument("--url", help="a Cadence run's trainer; default: one started here")
    parser.add_argument("--token-file", type=Path)
    parser.add_argument("--weights-url", help="where the pool fetches the published files")
    parser.add_argument("--model", type=Path, help="default: a tiny random-weight Llama")
    parser.add_argument("--work", type=Path, help="default: a temporary folder")
    a = parser.parse_args()

    work = a.work or Path(tempfile.mkdtemp(prefix="trl-on-cadence-"))
    publish = work / "publish"
    if a.connect is not None:  # a run `cadence run` started: its trainer, model, folder
        try:
            invitation = wait_for_invitation(a.connect, timeout_s=a.wait_s)
        except NoInvitation as e:
            sys.exit(f"train_on_cadence: {e}")
        a.url, a.token_file = invitation.url, invitation.token_file
        a.model, publish = invitation.model, invitation.publish_dir
    model = a.model or make_tiny_llama(work / "model")
    rng = random.Random(0)
    dataset = [
        {"prompt": f"After {x} and {y}, write 7 again and again:", "answer": "7"}
        for x, y in ((rng.randint(2, 99), rng.randint(2, 99)) for _ in range(256))
    ]
    run_on_cpu()
    pool: contextlib.AbstractContextManager[tuple[str, str]]
    if a.url:
        token = a.token_file.read_text().strip() if a.token_file else ""
        pool = contextlib.nullcontext((a.url, token))
    else:
        pool = local_pool(model, work, a.iterations, a.eta)
    with pool as (url, token):
        run = run_settings(url, token)
        args = AsyncGRPOConfig(
            **agreeing(run),  # one Cadence batch per optimizer step and weight sync
            **CPU_SETTINGS,
            output_dir=str(work / "trl"),
            learning_rate=a.learning_rate,
            report_to=[],
            logging_steps=1,
            save_strategy="no",
        )
        tokenizer = AutoTokenizer.from_pretrained(model)
        worker = CadenceRolloutWorker(url, token, dataset, [sevens], tokenizer, args)
        base = a.weights_url
        transfer = CadenceWeightTransfer(
            url,
            token,
            publish,
            url_for=(lambda path: f"{base.rstrip('/')}/{path.name}") if base else None,
        )
        trainer = AsyncGRPOTrainer(
            model=str(model),
            args=args,
            train_dataset=Dataset.from_list(dataset),
            processing_class=tokenizer,
            rollout_worker=worker,
            weight_transfer=transfer,
        )
        trainer.train()
    steps = [h for h in trainer.state.log_history if "reward" in h]
    print(
        json.dumps(
            {
                "example": "trl_on_cadence",
                "iterations": run.iterations,
                "eta": run.eta,
                "samples_per_version": run.group_size * run.batch_groups,
                "reward_by_step": [round(float(h["reward"]), 4) for h in steps],
                "staleness_max": max(float(h.get("sample/staleness_max", 0)) for h in steps),
                "dropped_stale": sum(float(h.get("sample/dropped_stale_total", 0)) for h in steps),
                "published": [p.version for p in transfer.published],
                "samples_delivered": len(worker.delivered),
                "distinct_samples": len(set(worker.delivered)),
            }
        )
    )


if __name__ == "__main__":
    main()
