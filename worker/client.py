"""A typed async client for the worker API (the control loop's and peers' side).

Every method sends and returns the models in `api.py`; any answer other than success
raises `WorkerError` carrying the worker's status, reason and sentence.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from cadence.common.sources import Destinations, SourceRefused
from cadence.common.web import CLIENT_LIMITS, ServiceClient, ServiceError, client_verify
from cadence.worker.api import (
    BULK_ITEMS,
    AdvanceRequest,
    ClaimRequest,
    Delivery,
    EvictResponse,
    Fence,
    FenceRequest,
    FenceResponse,
    HostEvict,
    HostEvictMany,
    HostPlace,
    HostPlaceMany,
    HostStates,
    Outcome,
    Outcomes,
    PlaceRequest,
    PlaceResponse,
    ReleaseRequest,
    Source,
    TrajectoryState,
    WorkerState,
)
from cadence.worker.held import Refused
from cadence.worker.outbox import Rejected
from cadence.worker.state_progress import Observed

T = TypeVar("T")


class WorkerError(ServiceError):
    """A worker's refusal."""


class WorkerClient(ServiceClient):
    error = WorkerError
    default_timeout_s = 5.0

    async def state(self) -> WorkerState:
        state: WorkerState = await self._call("GET", "/v1/state", model=WorkerState)
        return state

    async def place(self, req: PlaceRequest, timeout_s: float | None = None) -> PlaceResponse:
        return PlaceResponse.model_validate(
            await self._call("POST", "/v1/trajectories", req, timeout_s=timeout_s)
        )

    async def evict(self, rid: str, timeout_s: float | None = None) -> EvictResponse:
        return EvictResponse.model_validate(
            await self._call("POST", f"/v1/trajectories/{rid}/evict", timeout_s=timeout_s)
        )

    async def claim(self, rid: str, req: ClaimRequest) -> TrajectoryState:
        return TrajectoryState.model_validate(
            await self._call("POST", f"/v1/parked/{rid}/claim", req)
        )

    async def release(self, rid: str, req: ReleaseRequest) -> None:
        await self._call("POST", f"/v1/parked/{rid}/release", req)

    async def advance(self, req: AdvanceRequest, timeout_s: float = 600.0) -> WorkerState:
        """Fetching and loading a version's weights takes long: its own timeout."""
        return WorkerState.model_validate(
            await self._call("POST", "/v1/advance", req, timeout_s=timeout_s)
        )

    async def fence(self, items: list[Fence]) -> list[str]:
        """Drop copies older than these attempts; the ids dropped."""
        body = FenceRequest(items=items)
        return FenceResponse.model_validate(await self._call("POST", "/v1/fence", body)).dropped

    async def drain(self) -> list[EvictResponse]:
        return _EVICTED.validate_python(await self._call("POST", "/v1/drain"))


_EVICTED = TypeAdapter(list[EvictResponse])


class HostClient(ServiceClient):
    """A worker host's bulk calls (`worker/host.py`). Each item comes back as its answer
    or as the `WorkerError` its single call would raise, in the order given."""

    error = WorkerError
    default_timeout_s = 5.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._token: str | None = None  # of the host's last answer
        self._whole: dict[str, WorkerState] = {}  # each worker's last whole state

    async def states(self) -> dict[str, Observed]:
        """Every hosted worker's state, whole or as progress on the whole state this
        client received last (`worker/state_progress.py`)."""
        path = "/v1/states" if self._token is None else f"/v1/states?since={self._token}"
        self._token = None  # until this answer arrives: a lost one makes the next whole
        answer: HostStates = await self._call("GET", path, model=HostStates)
        missing = set(answer.progress) - set(self._whole)
        if missing:
            raise WorkerError(
                502, "bad_progress", f"progress for {sorted(missing)[0]} with no state to apply"
            )
        whole = {w: self._whole[w] for w in answer.progress} | answer.states
        self._whole, self._token = whole, answer.token
        return {w: Observed(st, answer.progress.get(w)) for w, st in whole.items()}

    async def place(
        self, items: list[tuple[str, PlaceRequest]], timeout_s: float | None = None
    ) -> list[PlaceResponse | WorkerError]:
        bodies = [
            HostPlaceMany(items=[HostPlace(worker=w, request=r) for w, r in chunk])
            for chunk in _chunks(items)
        ]
        outcomes = await self._bulk("/v1/place", bodies, timeout_s)
        return [o.placed if o.placed is not None else self._error(o) for o in outcomes]

    async def evict(
        self, items: list[tuple[str, str]], timeout_s: float | None = None
    ) -> list[EvictResponse | WorkerError]:
        bodies = [
            HostEvictMany(items=[HostEvict(worker=w, id=i) for w, i in chunk])
            for chunk in _chunks(items)
        ]
        outcomes = await self._bulk("/v1/evict", bodies, timeout_s)
        return [o.evicted if o.evicted is not None else self._error(o) for o in outcomes]

    async def _bulk(
        self, path: str, bodies: Sequence[BaseModel], timeout_s: float | None
    ) -> list[Outcome]:
        """The bodies' outcomes in order, one call after another: more than `BULK_ITEMS`
        items go in several calls (a pool filling up places thousands on one host)."""
        out: list[Outcome] = []
        for body in bodies:
            answer: Outcomes = await self._call(
                "POST", path, body, timeout_s=timeout_s, model=Outcomes
            )
            out += answer.items
        return out

    @staticmethod
    def _error(outcome: Outcome) -> WorkerError:
        p = outcome.problem
        return WorkerError(outcome.status, p.reason if p else "unknown", p.error if p else "")


class Peers:
    """How a worker reaches the worker a trajectory is parked on: over HTTP with the
    pool's token. A peer's refusal becomes this worker's refusal, with its reason."""

    def __init__(
        self,
        token: str,
        transport: httpx.AsyncBaseTransport | None = None,
        destinations: Destinations | None = None,
    ) -> None:
        self.token = token
        self.transport = transport
        self.destinations = destinations or Destinations()

    async def claim(self, source: Source, rid: str, req: ClaimRequest) -> TrajectoryState:
        state: TrajectoryState = await self._at(source, lambda c: c.claim(rid, req))
        return state

    async def release(self, source: Source, rid: str, req: ReleaseRequest) -> None:
        await self._at(source, lambda c: c.release(rid, req))

    async def _at(self, source: Source, call: Callable[[WorkerClient], Awaitable[Any]]) -> Any:
        try:
            await self.destinations.check(source.url)
        except SourceRefused as e:  # the token goes to the pool's peers only
            raise Refused(409, "source_refused", f"{source.worker_id}: {e}") from None
        client = WorkerClient(source.url, self.token, transport=self.transport)
        try:
            return await call(client)
        except WorkerError as e:
            raise Refused(409 if e.status < 500 else 502, e.reason, e.message) from None
        except (httpx.HTTPError, ValueError) as e:
            # Unreachable, or not a worker: the placement is refused and the control
            # loop puts the trajectory back where it is parked.
            raise Refused(
                409, "source_unreachable", f"{source.worker_id} at {source.url}: {e!r}"
            ) from None
        finally:
            await client.aclose()


# What the trainer answers a delivery it will never take: never admitted, not the
# current attempt, not trainable, too large. Anything else is retried.
FINAL_REFUSALS = frozenset({404, 409, 413, 422})


class TrainerSender:
    """Delivers finished trajectories to the trainer's ingest endpoint, keyed for
    idempotency; anything but success raises, so the outbox keeps and retries it."""

    def __init__(
        self, url: str, token: str, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.http = httpx.AsyncClient(
            base_url=url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=10.0,
            transport=transport,
            verify=client_verify(),
            limits=CLIENT_LIMITS,
        )

    async def __call__(self, delivery: Delivery) -> None:
        response = await self.http.post(
            "/v1/trajectories",
            content=delivery.model_dump_json(),
            headers={"content-type": "application/json", "idempotency-key": delivery.key},
        )
        if response.status_code in FINAL_REFUSALS:
            raise Rejected(f"{response.status_code} {response.text[:300]}")
        response.raise_for_status()


def _chunks(items: list[T]) -> list[list[T]]:
    """`items` in runs of at most `BULK_ITEMS`, what one bulk call may carry."""
    return [items[i : i + BULK_ITEMS] for i in range(0, len(items), BULK_ITEMS)]
