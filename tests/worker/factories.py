"""Worker factories: emulated engines with a deterministic token source and a fake clock,
and pools of cores wired to each other directly (the HTTP hop left out)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cadence.common.catalog import ACCELERATORS, MODELS
from cadence.common.physics import LINK_BYTES_PER_S, Deployment, deploy
from cadence.operator.local import processes as localpool
from cadence.worker.api import (
    ClaimRequest,
    FreshStart,
    Migration,
    PlaceRequest,
    ReleaseRequest,
    Sampling,
    Source,
    TrajectoryState,
)
from cadence.worker.core import WorkerCore
from cadence.worker.emulated import EmulatedEngine, Sampled, TokenSource
from cadence.worker.engine import EngineRequest
from cadence.worker.held import Identity


class FakeClock:
    """Time moves only when the engine sleeps or a test says the host worked."""

    def __init__(self) -> None:
        self.t = 100.0

    def now(self) -> float:
        return self.t

    async def sleep_until(self, deadline: float) -> None:
        self.t = max(self.t, deadline)

    def work(self, seconds: float) -> None:
        self.t += seconds


class CountingSource:
    """Greedy and deterministic: the next token is a function of the whole context, so a
    resumed trajectory continues exactly as an uninterrupted one would."""

    vocab_size: int | None = None  # the tests' token ids are their own

    def next_tokens(self, batch: Sequence[EngineRequest]) -> list[Sampled]:
        out = []
        for request in batch:
            ids = request.token_ids
            out.append(Sampled((sum(ids) * 31 + len(ids)) % 1000, -0.25))
        return out

    def forget(self, rid: str) -> None:
        pass

    def load_weights(self, path: Path) -> None:
        raise NotImplementedError("a counting source has no weights")


def deployment(accelerator: str = "H800", capacity: int | None = None) -> Deployment:
    d = deploy(MODELS["Qwen3-32B"], ACCELERATORS[accelerator], 20_000)
    if capacity is None:
        return d
    return Deployment(d.model, d.accelerator, d.tp, capacity, d.efficiency)


class Pool:
    """Cores that reach each other by calling methods, as the service does over HTTP.
    `down` names workers whose claim/release endpoints fail."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.cores: dict[str, WorkerCore] = {}
        self.down: set[str] = set()

    def add(
        self,
        wid: str,
        *,
        capacity: int = 100_000,
        version: int | None = 0,
        source: TokenSource | None = None,
        accelerator: str = "H800",
        kv_link: bool = True,
    ) -> WorkerCore:
        engine = EmulatedEngine(
            deployment(accelerator, capacity=capacity),
            source or CountingSource(),
            clock=self.clock,
            link_bytes_per_s=LINK_BYTES_PER_S if kv_link else None,
        )
        core = WorkerCore(
            Identity(wid, accelerator, 0), engine, self.clock, self._claim, self._release, version
        )
        self.cores[wid] = core
        return core

    def source(self, wid: str) -> Source:
        return Source(worker_id=wid, url=f"http://{wid}")

    async def _claim(self, source: Source, rid: str, req: ClaimRequest) -> TrajectoryState:
        if source.worker_id in self.down:
            raise ConnectionError(f"{source.worker_id} is down")
        return await self.cores[source.worker_id].claim(rid, req)

    async def _release(self, source: Source, rid: str, req: ReleaseRequest) -> None:
        if source.worker_id in self.down:
            raise ConnectionError(f"{source.worker_id} is down")
        self.cores[source.worker_id].release(rid, req)

    def where_resident(self, rid: str) -> list[str]:
        return [wid for wid, c in self.cores.items() if rid in c.resident]


def fresh(
    rid: str,
    *,
    attempt: int = 0,
    version: int = 0,
    prompt: int = 16,
    max_tokens: int = 40,
    sampling: Sampling | None = None,
) -> PlaceRequest:
    start = FreshStart(
        prompt_token_ids=list(range(1, prompt + 1)),
        max_tokens=max_tokens,
        sampling=sampling or Sampling(),
    )
    return PlaceRequest(id=rid, attempt=attempt, version=version, fresh=start)


def moved(
    rid: str, source: Source, *, attempt: int, version: int = 0, migration: Migration = "auto"
) -> PlaceRequest:
    return PlaceRequest(
        id=rid, attempt=attempt, version=version, source=source, migration=migration
    )


# --- worker processes ------------------------------------------------------------------

CADENCE = localpool.CADENCE
free_port = localpool.free_port
wait_healthy = localpool.wait_healthy
worker_processes = localpool.worker_processes
