"""Advancing a worker to a new policy version: weights checked and loaded, output
changed to what the new weights give, refused with residents or a bad checksum."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from cadence.worker.api import (
    AdvanceRequest,
    ClaimRequest,
    ReleaseRequest,
    Sampling,
    Source,
    TrajectoryState,
)
from cadence.worker.core import WorkerCore
from cadence.worker.emulated import EmulatedEngine
from cadence.worker.held import Identity, Refused
from cadence.worker.torchsource import TorchTokenSource

from .factories import FakeClock, deployment, fresh


@pytest.fixture(scope="module")
def model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny model (version 0) and a perturbed copy of its weights (version 1)."""
    path = tiny_model
    weights = load_file(path / "model.safetensors")
    generator = torch.Generator().manual_seed(1)
    changed = {
        k: v + 0.5 * torch.randn(v.shape, generator=generator).to(v.dtype)
        for k, v in weights.items()
    }
    v1 = tmp_path_factory.mktemp("v1") / "v1.safetensors"
    save_file(changed, v1)
    return path, v1


async def _read(uri: str) -> bytes:
    return Path(uri).read_bytes()


async def _no_claim(source: Source, rid: str, req: ClaimRequest) -> TrajectoryState:
    raise AssertionError("no peer is involved")


async def _no_release(source: Source, rid: str, req: ReleaseRequest) -> None:
    raise AssertionError("no peer is involved")


def _core(model_path: Path, store: Path) -> WorkerCore:
    clock = FakeClock()
    engine = EmulatedEngine(deployment(), TorchTokenSource(model_path), clock=clock)
    identity = Identity("w", "H800", 0)
    return WorkerCore(
        identity, engine, clock, _no_claim, _no_release, 0, fetch_weights=_read, weights_dir=store
    )


def _greedy(core: WorkerCore, rid: str, version: int) -> list[int]:
    request = fresh(rid, version=version, max_tokens=12, sampling=Sampling(temperature=0.0))

    async def go() -> list[int]:
        await core.place(request)
        while core.resident:
            await core.step()
        return [t for turn in core.finished.pop().turns for t in turn.token_ids]

    return asyncio.run(go())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_advance_changes_the_output_to_the_new_weights(
    model: tuple[Path, Path], tmp_path: Path
) -> None:
    base, v1 = model
    core = _core(base, tmp_path / "store")
    before = _greedy(core, "a", 0)
    asyncio.run(core.advance(AdvanceRequest(version=1, weights_uri=str(v1), sha256=_sha(v1))))
    assert core.version == 1
    after = _greedy(core, "b", 1)
    reference = _core(base, tmp_path / "ref")
    asyncio.run(reference.engine.load_weights(v1))
    reference.version = 1
    assert after == _greedy(reference, "c", 1)
    assert after != before
    assert core.weights_file(1).read_bytes() == v1.read_bytes()  # served to peers


def test_advance_is_refused_with_residents_or_a_bad_checksum(
    model: tuple[Path, Path], tmp_path: Path
) -> None:
    base, v1 = model
    core = _core(base, tmp_path / "store")
    asyncio.run(core.place(fresh("t")))
    good = AdvanceRequest(version=1, weights_uri=str(v1), sha256=_sha(v1))
    with pytest.raises(Refused) as e:
        asyncio.run(core.advance(good))
    assert (e.value.status, e.value.reason) == (409, "residents")
    core.evict("t")
    bad = AdvanceRequest(version=1, weights_uri=str(v1), sha256="0" * 64)
    with pytest.raises(Refused) as e:
        asyncio.run(core.advance(bad))
    assert e.value.reason == "checksum" and core.version == 0
    with pytest.raises(Refused, match="does not hold"):
        core.weights_file(1)
