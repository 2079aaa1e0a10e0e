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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from cadence.common.web import ServiceClient, ServiceError
from cadence.trainer.api import (
    AdmitRequest,
    AdmitResponse,
    Batch,
    EndedPage,
    LedgerView,
    PromptQueue,
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

# One submission's share of the service's body limit (web.MAX_BODY_BYTES, 8 MiB), and of
# its 100,000 prompts a request.
CHUNK_BYTES = 4 << 20
CHUNK_PROMPTS = 10_000


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

    async def submit(self, prompts: Sequence[SubmittedPrompt], first: int | None = None) -> int:
        """Queue prompts for admission, in order; returns how many are queued in all. With
        `first`, they are the run's prompts numbered from `first` (safe to send again)."""
        body = SubmitRequest(prompts=list(prompts), first=first)
        return PromptQueue.model_validate(await self._call("POST", "/v1/prompts", body)).queued

    async def prompt_queue(self) -> PromptQueue:
        return PromptQueue.model_validate(await self._call("GET", "/v1/prompts"))

    async def submit_all(
        self,
        prompts: Iterable[SubmittedPrompt],
        *,
        window: int | None = None,
        poll_s: float = 0.2,
        chunk_bytes: int = CHUNK_BYTES,
        chunk_prompts: int = CHUNK_PROMPTS,
    ) -> int:
        """Submit a dataset of any size: in chunks that fit one request (by count and by
        bytes), each numbered so that a retry queues nothing twice, and, with `window`,
        never more than `window` prompts queued ahead of admission (the run admits as it
        trains, so the ledger holds what is near, not the whole dataset). `prompts` is
        read lazily. Returns how many are queued in all."""
        if window is not None and window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        queued = (await self.prompt_queue()).queued if window is not None else 0
        chunk: list[SubmittedPrompt] = []
        first = size = 0
        for prompt in prompts:
            cost = len(prompt.model_dump_json()) + 1
            if chunk and (len(chunk) >= chunk_prompts or size + cost > chunk_bytes):
                queued = await self._send(chunk, first, window, poll_s)
                first, chunk, size = first + len(chunk), [], 0
            chunk.append(prompt)
            size += cost
        if chunk:
            queued = await self._send(chunk, first, window, poll_s)
        return queued

    async def _send(
        self, chunk: list[SubmittedPrompt], first: int, window: int | None, poll_s: float
    ) -> int:
        if window is not None:
            while True:
                q = await self.prompt_queue()
                if q.queued - q.admitted < window:
                    break
                await asyncio.sleep(poll_s)
        return await self.submit(chunk, first=first)

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
