"""TRL's weight-transfer seam, served by a Cadence run.

TRL calls `send_weights` with every trainable parameter after each weight sync. Here they
are written as one safetensors file and published to the Cadence run as the next version
(its sha256 checked by the run); the run's workers advance to it at their next safe
point, with no collective between trainer and workers. TRL's first sync sends the weights
it started from, which the run already serves as version 0: it is kept, not published.

The run reads the file by path when it shares a volume with this process (`publish_dir`
is under the run's `publishFrom`), or by http(s) URL when `url_for` says where the pool
can fetch it."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from safetensors.torch import save_file

from cadence.trainer.api import VersionInfo
from cadence.trainer.client import TrainerClient, TrainerError


@dataclass
class CadenceWeightTransfer:
    """TRL's `WeightTransferProtocol` over a Cadence run (external-trainer mode)."""

    url: str
    token: str
    publish_dir: Path
    url_for: Callable[[Path], str] | None = None  # None: the run reads the path itself
    retry_for_s: float = 120.0  # how long a publish is asked again while unreachable
    transport: httpx.AsyncBaseTransport | None = None  # how the service is reached
    syncs: int = 0  # weight syncs seen, the cold one included
    published: list[VersionInfo] = field(default_factory=list)

    def init_weight_transfer(self) -> None:
        self.publish_dir.mkdir(parents=True, exist_ok=True)

    def pause(self) -> None:
        """Nothing to pause: Cadence's workers go on decoding and advance by themselves."""

    def resume(self) -> None:
        """See `pause`."""

    def destroy(self) -> None:
        """Nothing held between syncs."""

    def send_weights(self, weights: Iterator[tuple[str, Any]]) -> None:
        # TRL's tensors share memory with the live parameters: copied before they change.
        tensors = {name: t.detach().to("cpu").clone().contiguous() for name, t in weights}
        self.syncs += 1
        version = self.syncs - 1  # the cold sync is version 0, which the run serves already
        if version == 0:
            return
        path = self.publish_dir / f"v{version}.safetensors"
        save_file(tensors, str(path))
        uri = self.url_for(path) if self.url_for is not None else str(path)
        self.published.append(asyncio.run(self._publish(version, uri, path)))

    async def _publish(self, version: int, uri: str, path: Path) -> VersionInfo:
        """Publish, asking again while the service is unreachable (for up to
        `retry_for_s`); an answer lost on the way is found by reading the version back."""
        client = TrainerClient(self.url, self.token, timeout_s=600.0, transport=self.transport)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_for_s
        try:
            sha256 = await asyncio.to_thread(_sha256, path)
            while True:
                try:
                    return await client.publish(version, uri, sha256)
                except httpx.TransportError:
                    if loop.time() > deadline:
                        raise
                    await asyncio.sleep(1.0)
                except TrainerError as e:
                    if e.reason != "publish":
                        raise
                    current = await client.version()
                    if current.version != version:
                        raise
                    # An earlier try was published and its answer lost. (The run stores
                    # the weights anew, so the sha256 it reports is its file's.)
                    return current
        finally:
            await client.aclose()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
