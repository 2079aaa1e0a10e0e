"""Where services read weights from and whom they give the pool's token (issue 19): a
worker's token goes to the trainer's host and the pod network only; weights come from
a `/v1/weights/N` endpoint there or a configured directory, never another path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cadence.common.sources import Destinations, SourceRefused, WeightsSource


@pytest.mark.parametrize(
    "url",
    [
        "http://10.1.2.3:8000/v1/weights/3",
        "http://127.0.0.1:8100/v1/weights/0",
        "https://[fd00::5]:8000/w1/v1/weights/2",
        "http://digits-trainer.default.svc:8100/v1/weights/1",  # the configured trainer
        "http://localhost:8000/v1/weights/1",  # resolves to loopback
    ],
)
def test_the_pool_and_its_trainer_may_receive_the_token(url: str) -> None:
    allowed = Destinations.of("http://digits-trainer.default.svc:8100")
    asyncio.run(allowed.check(url))


@pytest.mark.parametrize(
    "url",
    [
        "http://8.8.8.8/v1/weights/1",  # the internet
        "http://169.254.169.254/v1/weights/1",  # cloud metadata
        "http://[2001:db8::1]/v1/weights/1",
        "ftp://10.0.0.1/v1/weights/1",
        "http://no-such-host.invalid/v1/weights/1",
    ],
)
def test_anywhere_else_never_sees_the_token(url: str) -> None:
    with pytest.raises(SourceRefused):
        asyncio.run(Destinations.of("http://digits-trainer.default.svc:8100").check(url))


def test_a_worker_reads_weights_only_from_an_endpoint_or_its_directory(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "v1.safetensors").write_bytes(b"weights")
    (tmp_path / "secret").write_text("not weights")
    source = WeightsSource("token", directory=store)
    assert asyncio.run(source.read(str(store / "v1.safetensors"))) == b"weights"
    for uri in (str(tmp_path / "secret"), f"{store}/../secret", "/etc/passwd"):
        with pytest.raises(SourceRefused, match="outside"):
            asyncio.run(source.read(uri))
    with pytest.raises(SourceRefused, match="reads weights from no directory"):
        asyncio.run(WeightsSource("token").read(str(store / "v1.safetensors")))
    with pytest.raises(SourceRefused, match="not a /v1/weights/N endpoint"):
        asyncio.run(source.read("http://10.0.0.1:8000/v1/state"))
