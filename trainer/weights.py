"""Published policy versions on disk, and the optimizer's state, in safetensors only.

A version is `v{N}.safetensors` with its sha256 beside it (`v{N}.sha256`); each is
written to a temporary name and renamed, so a reader never sees half a file. A version
is kept while it is the newest or any trajectory of it is unfinished (`retain`). The
optimizer's state is saved the same way (tensors named after their parameters), so a
restarted trainer continues the same optimisation, and nothing is ever unpickled.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from cadence.common.tensors import load_weights, weights_of


class WeightStore:
    def __init__(self, directory: Path, guard: Callable[[], None] | None = None) -> None:
        self.directory = directory
        # Called before each write or removal: the owner's `StateLock.check`.
        self.guard = guard or (lambda: None)
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, version: int) -> Path:
        return self.directory / f"v{version}.safetensors"

    def sha256(self, version: int) -> str:
        return (self.directory / f"v{version}.sha256").read_text().strip()

    def has(self, version: int) -> bool:
        return self.path(version).is_file() and (self.directory / f"v{version}.sha256").is_file()

    def versions(self) -> list[int]:
        return sorted(
            int(p.stem[1:]) for p in self.directory.glob("v*.safetensors") if p.stem[1:].isdigit()
        )

    def publish(self, model: Any, version: int) -> str:
        """Write the model's weights as `version`; returns their sha256."""
        self.guard()
        tensors = weights_of(model)  # a tied tensor once, as exported checkpoints hold it
        self.directory.mkdir(parents=True, exist_ok=True)  # deleted under a running trainer
        _write(self.path(version), tensors)
        digest = hashlib.sha256(self.path(version).read_bytes()).hexdigest()
        _write_text(self.directory / f"v{version}.sha256", digest)
        return digest

    def load_into(self, model: Any, version: int) -> None:
        load_weights(model, load_file(self.path(version)))

    def retain(self, keep: Iterable[int]) -> list[int]:
        """Remove every version not in `keep`; returns the removed ones."""
        kept = set(keep)
        removed = [v for v in self.versions() if v not in kept]
        for v in removed:
            self.remove(v)
        return removed

    def remove(self, version: int) -> None:
        self.guard()
        self.path(version).unlink(missing_ok=True)
        (self.directory / f"v{version}.sha256").unlink(missing_ok=True)
        (self.directory / f"optimizer-v{version}.safetensors").unlink(missing_ok=True)


def save_optimizer(optimizer: torch.optim.Optimizer, model: Any, path: Path) -> None:
    names = {id(p): n for n, p in model.named_parameters()}
    tensors: dict[str, torch.Tensor] = {}
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{names[id(param)]}::{key}"] = value.detach().contiguous().cpu()
    _write(path, tensors)


def load_optimizer(optimizer: torch.optim.Optimizer, model: Any, path: Path) -> None:
    params = dict(model.named_parameters())
    for name, value in load_file(path).items():
        pname, key = name.rsplit("::", 1)
        optimizer.state[params[pname]][key] = value


def _write(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    partial = path.with_name(path.name + ".partial")
    save_file(tensors, partial)
    os.replace(partial, path)


def _write_text(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text + "\n")
    os.replace(partial, path)
