"""Weights of a model with a tied output layer (`common/tensors.py`): written with the tied
tensor once, as exported checkpoints and TRL's weight syncs hold it, and read back
strictly in every other respect; a run on such a model publishes its versions and its
workers load them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from cadence.common.tensors import WeightsMismatch, load_weights, weights_of
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer
from cadence.worker.tinymodel import make_tiny_llama
from cadence.worker.torchsource import TorchTokenSource


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tied"), tie_embeddings=True)


def test_a_tied_tensor_is_written_once_and_read_back_into_both_names(tied: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tied)
    weights = weights_of(model)
    assert "lm_head.weight" not in weights and "model.embed_tokens.weight" in weights
    other = AutoModelForCausalLM.from_pretrained(tied)
    changed = {k: v + 1 for k, v in weights.items()}
    load_weights(other, changed)
    assert torch.equal(other.lm_head.weight, changed["model.embed_tokens.weight"])
    assert torch.equal(other.model.norm.weight, changed["model.norm.weight"])


def test_weights_that_do_not_fit_are_refused_by_name_and_change_nothing(
    tied: Path, tiny_model: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tied)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weights = {k: v + 1 for k, v in weights_of(model).items()}
    del weights["model.norm.weight"]
    weights["model.extra.weight"] = torch.zeros(1)
    with pytest.raises(WeightsMismatch, match=r"missing model\.norm\.weight; unknown model\.extra"):
        load_weights(model, weights)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # Untied, the output layer is a tensor of its own: leaving it out is refused.
    untied = AutoModelForCausalLM.from_pretrained(tiny_model)
    given = {k: v for k, v in untied.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(WeightsMismatch, match=r"missing lm_head\.weight"):
        load_weights(untied, given)


def test_a_run_starts_on_a_tied_model_and_its_workers_load_its_versions(
    tied: Path, tmp_path: Path
) -> None:
    """safetensors refuses one tensor under two names: a run on such a model could not
    publish its version 0 (nor any update of it)."""
    trainer = Trainer(
        TrainerConfig(model_path=tied, state_dir=tmp_path / "state", group_size=2, batch_groups=1)
    )
    assert trainer.store.has(0)
    worker = TorchTokenSource(tied)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.25)
    trainer.store.publish(trainer.model, 1)
    worker.load_weights(trainer.store.path(1))
    assert torch.equal(worker.model.lm_head.weight, trainer.model.model.embed_tokens.weight)
