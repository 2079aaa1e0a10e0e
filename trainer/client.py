"""A typed async client for the trainer's API: what the control loop uses, and what an
external trainer (verl, TRL, a custom loop) uses to drive the pool through Cadence.

An external trainer runs the trainer service with `task="external"`, then: `submit`
prompts, `batch(u)` to receive batch u whole (every sample with its version and the
behaviour logprobs of its tokens), trains on it however it likes, and `publish(u + 1,
uri)` the new weights; the pool advances to them. Batches come out in order and only
whole, so the staleness bound eta holds for whoever trains on them.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from cadence.common.web import ServiceClient, ServiceError
from cadence.trainer.api import (
    AdmitRequest,
    AdmitResponse,
    Batch,
    EndedPage,
    LedgerView,
    PublishRequest,
    Record,
    RecordMany,
    RecordRequest,
    RequeueRequest,
    RequeueResponse,
    RunSettings,
    RunStats,
    SubmitRequest,
    SubmittedPrompt,
    VersionInfo,
)


class TrainerError(ServiceError):
    """The trainer's refusal."""


class TrainerClient(ServiceClient):
    error = TrainerError
    default_timeout_s = 10.0

    async def ledger(self, since: str | None = None) -> LedgerView:
        """The whole ledger view; with `since` (an earlier view's `since`), what changed
        after it where the trainer can say (`LedgerView.delta`)."""
        path = "/v1/ledger" if since is None else f"/v1/ledger?since={since}"
        view: LedgerView = await self._call("GET", path, model=LedgerView)
        return view

    async def ended(self, after: int = -1, limit: int = 1000) -> EndedPage:
        """The deliveries accepted after seq `after`, by their sizes and times."""
        return EndedPage.model_validate(
            await self._call("GET", f"/v1/ended?after={after}&limit={limit}")
        )

    async def admit(self, groups: int) -> list[int]:
        body = AdmitRequest(groups=groups)
        return AdmitResponse.model_validate(await self._call("POST", "/v1/admit", body)).groups

    async def record(self, sid: str, req: RecordRequest) -> bool:
        return bool((await self._call("POST", f"/v1/samples/{sid}/record", req))["recorded"])

    async def record_many(self, records: Sequence[Record]) -> int:
        if not records:
            return 0
        body = RecordMany(records=list(records))
        return int((await self._call("POST", "/v1/samples/record", body))["recorded"])

    async def requeue(self, sid: str, fault: Literal["sample", "worker"] = "sample") -> int:
        body = RequeueRequest(fault=fault)
        data = await self._call("POST", f"/v1/samples/{sid}/requeue", body)
        return RequeueResponse.model_validate(data).attempt

    async def version(self, v: int | None = None) -> VersionInfo:
        path = "/v1/version" if v is None else f"/v1/versions/{v}"
        return VersionInfo.model_validate(await self._call("GET", path))

    def weights_uri(self, info: VersionInfo) -> str:
        return self.url + info.weights_path

    async def stats(self) -> RunStats:
        return RunStats.model_validate(await self._call("GET", "/v1/stats"))

    # --- for external trainers -----------------------------------------------------------

    async def settings(self) -> RunSettings:
        """The run's group size, batch, iterations, eta, sampling and token limits."""
        return RunSettings.model_validate(await self._call("GET", "/v1/settings"))

    async def submit(self, prompts: Sequence[SubmittedPrompt]) -> int:
        """Queue prompts for admission, in order; returns how many are queued in all."""
        data = await self._call("POST", "/v1/prompts", SubmitRequest(prompts=list(prompts)))
        return int(data["queued"])

    async def batch(self, u: int, *, poll_s: float = 0.2, timeout_s: float | None = None) -> Batch:
        """Batch `u`, whole: waits (polling) until every sample of it is delivered."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            try:
                return Batch.model_validate(await self._call("GET", f"/v1/batches/{u}"))
            except TrainerError as e:
                if e.reason != "incomplete" or (deadline is not None and loop.time() > deadline):
                    raise
            await asyncio.sleep(poll_s)

    async def publish(
        self, version: int, uri: str | Path, sha256: str | None = None
    ) -> VersionInfo:
        """Publish `version` (the update of batch `version - 1`) from `uri`: a path the
        trainer can read, or an http(s) URL. The sha256 is computed for a local path."""
        if sha256 is None:
            sha256 = hashlib.sha256(Path(uri).read_bytes()).hexdigest()
        body = PublishRequest(version=version, weights_uri=str(uri), sha256=sha256)
        return VersionInfo.model_validate(await self._call("POST", "/v1/publish", body))
