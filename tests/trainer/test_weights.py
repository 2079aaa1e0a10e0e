"""Published versions and optimizer state on disk: checksummed, retained only while
needed, and restored exactly, so a restarted trainer continues the same optimisation."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from cadence.trainer.weights import WeightStore, load_optimizer, save_optimizer


def _model(path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def test_versions_are_checksummed_and_only_the_kept_ones_remain(
    tiny_model: Path, tmp_path: Path
) -> None:
    store = WeightStore(tmp_path)
    model = _model(tiny_model)
    for v in range(4):
        digest = store.publish(model, v)
        assert digest == hashlib.sha256(store.path(v).read_bytes()).hexdigest()
    assert store.retain({1, 3}) == [0, 2]
    assert store.versions() == [1, 3] and not store.has(0)


def test_optimizer_state_round_trips_through_safetensors(tiny_model: Path, tmp_path: Path) -> None:
    model = _model(tiny_model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    save_optimizer(optimizer, model, tmp_path / "opt.safetensors")
    store = WeightStore(tmp_path / "w")
    store.publish(model, 1)

    restored = _model(tiny_model)
    store.load_into(restored, 1)
    again = torch.optim.AdamW(restored.parameters(), lr=1e-2)
    load_optimizer(again, restored, tmp_path / "opt.safetensors")
    for (name, p), q in zip(model.named_parameters(), restored.parameters(), strict=True):
        assert torch.equal(p, q), name
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[p][key], again.state[q][key])
