"""TRL's AsyncGRPOTrainer trains on a Cadence pool (`cadence.integrations.trl`): a Cadence
run in external-trainer mode (its trainer service, emulated workers, the control loop)
in a thread, TRL in the test's; TRL's prompts go to the run, whole batches come back as
TRL's rollout samples, each update is published and the workers advance to it. CPU only:
TRL's tree attention (a hub-fetched flash-attention kernel) is replaced by the pure-torch
one `run_on_cpu` registers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cadence.integrations.trl import (
    CadenceRolloutWorker,
    CadenceWeightTransfer,
    Disagreement,
    agreeing,
    check_agreement,
)
from cadence.operator.local.external import external_run
from cadence.trainer.api import RunSettings
from cadence.trainer.config import TrainerConfig
from cadence.trainer.rewards import digits_reward

pytest.importorskip("trl", reason="the trl extra is not installed")
import numpy as np
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.experimental.async_grpo.async_grpo_config import AsyncGRPOConfig
from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer
from trl.experimental.async_grpo.packing import TreeRow

from cadence.integrations.trl.cpu import (
    CPU_SETTINGS,
    register_torch_tree_attention,
    run_on_cpu,
)

TOKEN = "s3cret"
G, B, ITERATIONS, ETA, MAX_TOKENS = 4, 2, 3, 1, 8


def _args(tmp: Path, **changes: Any) -> Any:
    settings: dict[str, Any] = {
        **agreeing(RUN),  # 4 x 2 = one Cadence batch (B x G) per sync
        **CPU_SETTINGS,
        "output_dir": str(tmp / "trl"),
        "learning_rate": 1e-3,
        "report_to": [],
        "logging_steps": 1,
        "save_strategy": "no",
    }
    settings.update(changes)
    return AsyncGRPOConfig(**settings)


RUN = RunSettings(
    task="external",
    group_size=G,
    batch_groups=B,
    iterations=ITERATIONS,
    eta=ETA,
    max_tokens=MAX_TOKENS,
    temperature=1.0,
)


def test_the_settings_that_must_agree_are_checked_naming_both_sides(tmp_path: Path) -> None:
    check_agreement(_args(tmp_path), RUN)  # agrees
    cases = {
        "num_generations": (8, "TRL's num_generations is 8 but the Cadence run's groupSize is 4"),
        "temperature": (0.7, "TRL's temperature is 0.7 but the Cadence run samples at"),
        "max_completion_length": (16, "TRL's max_completion_length is 16 but the Cadence run's"),
        "max_staleness": (0, "TRL's max_staleness is 0 but the Cadence run's eta is 1"),
        "token_budget": (4096, "TRL's token_budget is 4096"),
        "gradient_accumulation_steps": (1, "TRL trains on 4 samples per weight sync"),
        "max_steps": (10, "TRL's max_steps is 10 but the Cadence run's 3 iterations"),
    }
    for name, (value, said) in cases.items():
        with pytest.raises(Disagreement, match="^" + said.replace("(", r"\(")):
            check_agreement(_args(tmp_path, **{name: value}), RUN)
    with pytest.raises(Disagreement, match=r"dataset\.task is digits"):
        check_agreement(_args(tmp_path), RUN.model_copy(update={"task": "digits"}))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_trls_async_grpo_trainer_trains_on_a_cadence_pool(tmp_path: Path, tiny_model: Path) -> None:
    def sevens(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [digits_reward(c, a) for c, a in zip(completions, answer, strict=True)]

    dataset = [
        {"prompt": f"After {a} and {a + 1}, write 7 again and again:", "answer": "7"}
        for a in range(2, 2 + B * ITERATIONS)
    ]
    run_on_cpu()
    config = TrainerConfig(
        model_path=tiny_model,
        state_dir=tmp_path / "state",
        task="external",
        group_size=G,
        batch_groups=B,
        iterations=ITERATIONS,
        eta=ETA,
        max_tokens=MAX_TOKENS,
        publish_from=tmp_path / "publish",
    )
    with external_run(config, token=TOKEN, logs=tmp_path) as run:
        url, cadence = run.url, run.trainer
        tokenizer = AutoTokenizer.from_pretrained(tiny_model)
        args = _args(tmp_path)
        worker = CadenceRolloutWorker(url, TOKEN, dataset, [sevens], tokenizer, args)
        transfer = CadenceWeightTransfer(url, TOKEN, tmp_path / "publish")
        trainer = AsyncGRPOTrainer(
            model=str(tiny_model),
            args=args,
            train_dataset=Dataset.from_list(dataset),
            processing_class=tokenizer,
            rollout_worker=worker,
            weight_transfer=transfer,
        )
        trainer.train()
        assert trainer.model_version == ITERATIONS + 1  # TRL's count: the cold sync is 1
        # Every version TRL trained was published to the run, and the run is done.
        assert [p.version for p in transfer.published] == list(range(1, ITERATIONS + 1))
        assert cadence.ledger.version == ITERATIONS
    # Every admitted sample reached TRL once and was consumed once.
    samples = ITERATIONS * B * G
    assert len(worker.delivered) == len(set(worker.delivered)) == samples
    assert cadence.ledger.counts() == {"consumed": samples, "failed": 0}
    # No sample older than the bound was trained on, by either side's count.
    assert set(cadence.ledger.lag_counts()) <= set(range(ETA + 1))
    logged = trainer.state.log_history
    assert not any(h.get("sample/dropped_stale_total") for h in logged)
    staleness = [h["sample/staleness_max"] for h in logged if "sample/staleness_max" in h]
    assert staleness and max(staleness) <= ETA


def test_the_cpu_tree_attention_scores_packed_samples_as_plain_attention_does(
    tiny_model: Path,
) -> None:
    """TRL forwards samples that share a prompt once, as a prefix tree; on CPU the
    torch tree attention must give each trained token the logprob an ordinary causal
    forward of its own sample gives it."""
    register_torch_tree_attention()
    packed_model = AutoModelForCausalLM.from_pretrained(
        tiny_model, attn_implementation="tree_fa3", dtype=torch.float32
    )
    plain = AutoModelForCausalLM.from_pretrained(
        tiny_model, attn_implementation="eager", dtype=torch.float32
    )
    samples = [
        {"input_ids": [2, 5, 6, 7, 9, 11], "completion_mask": [0, 0, 0, 1, 1, 1]},
        {"input_ids": [2, 5, 6, 8, 10], "completion_mask": [0, 0, 0, 1, 1]},
        {"input_ids": [3, 4], "completion_mask": [0, 1]},
    ]
    row = TreeRow()  # type: ignore[no-untyped-call]
    for s in samples:
        n = len(s["input_ids"])
        row.add(
            {
                "input_ids": np.array(s["input_ids"]),
                "completion_mask": np.array(s["completion_mask"]),
                "old_log_probs": np.zeros(n, np.float32),
                "advantage": 1.0,
                "group_id": 0,
            }
        )
    p = row.pack()
    with torch.no_grad():
        logits = packed_model(
            input_ids=p["input_ids"][None],
            position_ids=p["position_ids"][None],
            tree_kv_index=p["tree_kv_index"],
            tree_cu_seqlens_q=p["tree_cu_seqlens_q"],
            tree_cu_seqlens_k=p["tree_cu_seqlens_k"],
            tree_max_seqlen_q=int(p["tree_max_seqlens"][0]),
            tree_max_seqlen_k=int(p["tree_max_seqlens"][1]),
        ).logits[0]
        labels = p["shift_labels"][p["token_index"]]
        packed = torch.log_softmax(logits[p["token_index"]].float(), -1)
        packed = packed.gather(-1, labels[:, None])[:, 0]
        expected = []
        for s in samples:
            ids = torch.tensor(s["input_ids"])[None]
            lp = torch.log_softmax(plain(ids).logits[0].float(), -1)
            expected += [
                float(lp[t - 1, ids[0, t]])
                for t in range(1, ids.shape[1])
                if s["completion_mask"][t]
            ]
    assert len(expected) == len(packed) == 6
    assert torch.allclose(packed, torch.tensor(expected), atol=1e-5)
