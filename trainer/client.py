"""A typed async client for the trainer's API: what the control loop uses, and what an
external trainer (verl, TRL, a custom loop) uses to drive the pool through Cadence."""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import BaseModel

from cadence.trainer.api import (
    AdmitRequest,
    AdmitResponse,
    LedgerView,
    RecordRequest,
    RequeueResponse,
    RunStats,
    VersionInfo,
)
from cadence.worker.api import Problem


class TrainerError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason


class TrainerClient:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(self, method: str, path: str, body: BaseModel | None = None) -> Any:
        content = body.model_dump_json() if body is not None else None
        headers = {"content-type": "application/json"} if body is not None else None
        response = await self.http.request(method, path, content=content, headers=headers)
        if response.is_success:
            return response.json()
        try:
            p = Problem.model_validate_json(response.content)
        except ValueError:
            p = Problem(error=response.text[:200] or response.reason_phrase, reason="http")
        raise TrainerError(response.status_code, p.reason, p.error)

    async def ledger(self) -> LedgerView:
        return LedgerView.model_validate(await self._call("GET", "/v1/ledger"))

    async def admit(self, groups: int) -> list[int]:
        body = AdmitRequest(groups=groups)
        return AdmitResponse.model_validate(await self._call("POST", "/v1/admit", body)).groups

    async def record(self, sid: str, req: RecordRequest) -> bool:
        return bool((await self._call("POST", f"/v1/samples/{sid}/record", req))["recorded"])

    async def requeue(self, sid: str) -> int:
        data = await self._call("POST", f"/v1/samples/{sid}/requeue")
        return RequeueResponse.model_validate(data).attempt

    async def version(self, v: int | None = None) -> VersionInfo:
        path = "/v1/version" if v is None else f"/v1/versions/{v}"
        return VersionInfo.model_validate(await self._call("GET", path))

    def weights_uri(self, info: VersionInfo) -> str:
        return self.url + info.weights_path

    async def stats(self) -> RunStats:
        return RunStats.model_validate(await self._call("GET", "/v1/stats"))
