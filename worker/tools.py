"""Multi-turn: finding a tool call in what a model decodes, and asking the environment.

A trajectory that writes a complete tool call (`<tool>...</tool>`, the format of the
reference calculator in `calculator.py`) departs: its KV is freed and its token state is
parked, marked as waiting for the environment, while the environment answers. The
observation is appended as an environment turn and the trajectory becomes placeable
again (parked, "ready"). Everything the model decoded after the call closed is dropped,
on both engines: vLLM streams a few tokens past the call before its abort lands.

The environment is retried a bounded number of times with a timeout per try; when it
keeps failing the sample ends, delivered marked failed, never left hanging. A model
that writes a call when it has no calls left is not answered: the text stays text and
decoding goes on.

Each call names the trajectory, its attempt and the call's index: an environment keeps
its answer per call of one attempt, so a retry gets the same observation and a
trajectory run again from its start (a new attempt) gets its own. The environment is
one of the pool's services: it takes the pool's bearer token, and the CA bundle
`CADENCE_CA_FILE` names when it serves TLS.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from cadence.common.web import CLIENT_LIMITS, client_verify
from cadence.worker.calculator import ToolRequest, ToolResponse
from cadence.worker.engine import Clock

CALL_END = "</tool>"

# (trajectory id, call index, the model's text since the last observation, the
# trajectory's attempt) -> observation
AskEnvironment = Callable[[str, int, str, int], Awaitable[str]]


class HttpEnvironment:
    """An environment behind HTTP (`POST {url}/v1/tool`, the calculator's API), called
    with the pool's bearer token."""

    def __init__(
        self,
        url: str,
        token: str,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: ssl.SSLContext | bool | None = None,
    ) -> None:
        self.http = httpx.AsyncClient(
            base_url=url,
            headers={"Authorization": f"Bearer {token}"},
            transport=transport,
            verify=client_verify() if verify is None else verify,
            limits=CLIENT_LIMITS,
        )

    async def __call__(self, rid: str, index: int, text: str, attempt: int) -> str:
        body = ToolRequest(trajectory_id=rid, attempt=attempt, call_index=index, text=text[-4096:])
        response = await self.http.post(
            "/v1/tool",
            content=body.model_dump_json(),
            headers={"content-type": "application/json"},
        )
        response.raise_for_status()
        return ToolResponse.model_validate_json(response.content).observation


@dataclass
class ToolUse:
    decode: Callable[[Sequence[int]], str]
    encode: Callable[[str], list[int]]
    ask: AskEnvironment
    clock: Clock
    timeout_s: float = 30.0
    tries: int = 3
    backoff_s: float = 0.5
    window: int = 16  # tokens looked back, so a call's end split across steps is found

    def end_of_call(self, before: Sequence[int], new: Sequence[int]) -> int | None:
        """How many tokens of `new` it takes to complete a tool call, given the model's
        tokens `before` them since the last observation (already checked, no call in
        them); None when `new` completes none."""
        head = list(before[-self.window :])
        if not new or CALL_END not in self.decode(head + list(new)):
            return None
        for k in range(1, len(new) + 1):
            if CALL_END in self.decode(head + list(new[:k])):
                return k
        return None  # unreachable: the whole of `new` completes the call

    async def observe(self, rid: str, index: int, text: str, attempt: int = 0) -> list[int] | None:
        """The observation's tokens for call `index` of attempt `attempt` of trajectory
        `rid`, or None when the environment failed every try."""
        for n in range(self.tries):
            if n:
                await self.clock.sleep_until(self.clock.now() + self.backoff_s * 2 ** (n - 1))
            try:
                asked = self.ask(rid, index, text, attempt)
                observation = await asyncio.wait_for(asked, self.timeout_s)
            except Exception:  # down, timed out or answered nonsense: try again
                continue
            return self.encode(observation)
        return None
