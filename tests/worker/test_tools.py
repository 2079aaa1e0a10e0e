"""Multi-turn on a worker: a trajectory that writes a tool call departs, waits parked for
its environment (the reference calculator), and comes back placeable with the observation
appended; an environment that fails or hangs ends the sample failed, never hanging."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import httpx
import pytest

from cadence.worker import calculator
from cadence.worker.api import ClaimRequest, FreshStart, PlaceRequest, Source, TrajectoryState
from cadence.worker.core import WorkerCore
from cadence.worker.emulated import EmulatedEngine, Sampled
from cadence.worker.engine import EngineRequest
from cadence.worker.held import Identity, Refused
from cadence.worker.tools import AskEnvironment, HttpEnvironment, ToolUse

from .factories import FakeClock, Pool, deployment

PROMPT = "Q: what is 2 + 3? A:"


def _decode(ids: Sequence[int]) -> str:
    return "".join(chr(i) for i in ids)


def _encode(text: str) -> list[int]:
    return [ord(c) for c in text]


class ScriptedSource:
    """A model that writes `replies[n]` after the prompt (n = 0) or after its n-th
    observation, then dots: one character per token (token id = code point)."""

    def __init__(self, replies: Sequence[str]) -> None:
        self.replies = replies

    vocab_size: int | None = None  # the tests' token ids are their own

    def next_tokens(self, batch: Sequence[EngineRequest]) -> list[Sampled]:
        out = []
        for request in batch:
            text = _decode(request.token_ids)
            answered = text.count("</result>")
            tail = text.rsplit("</result>" if answered else "A:", 1)[-1]
            reply = self.replies[min(answered, len(self.replies) - 1)]
            out.append(Sampled(ord(reply[len(tail)]) if len(tail) < len(reply) else ord("."), -0.1))
        return out

    def forget(self, rid: str) -> None:
        pass

    def load_weights(self, path: object) -> None:
        raise NotImplementedError


def _calculator() -> AskEnvironment:
    transport = httpx.ASGITransport(app=calculator.create_app("s3cret"))
    return HttpEnvironment("http://env", "s3cret", transport=transport)


def _core(
    replies: Sequence[str], ask: AskEnvironment | None = None, *, timeout_s: float = 0.05
) -> WorkerCore:
    clock = FakeClock()
    engine = EmulatedEngine(deployment(), ScriptedSource(replies), clock=clock)
    tools = ToolUse(_decode, _encode, ask or _calculator(), clock, timeout_s=timeout_s, tries=3)

    async def claim(*_: object) -> TrajectoryState:
        raise AssertionError("no peer is involved")

    async def release(*_: object) -> None:
        raise AssertionError("no peer is involved")

    return WorkerCore(Identity("w", "H800", 0), engine, clock, claim, release, 0, tools=tools)


def _place(core: WorkerCore, rid: str, *, max_tokens: int = 60, calls: int = 2) -> None:
    start = FreshStart(
        prompt_token_ids=_encode(PROMPT), max_tokens=max_tokens, max_tool_calls=calls
    )
    asyncio.run(core.place(PlaceRequest(id=rid, attempt=0, version=0, fresh=start)))


async def _until(core: WorkerCore, done: Callable[[], bool], steps: int = 500) -> None:
    for _ in range(steps):
        if done():
            return
        if core.resident:
            await core.step()
        await asyncio.sleep(0.001)
    raise AssertionError("the condition was never met")


def _texts(state: TrajectoryState) -> list[tuple[str, str]]:
    return [(t.role, _decode(t.token_ids)) for t in state.turns]


def test_a_tool_call_departs_and_returns_with_the_observation() -> None:
    core = _core(["Let me <tool>calc 2 + 3</tool> and more", " so 5"])
    _place(core, "t")

    async def run() -> TrajectoryState:
        await _until(core, lambda: "t" in core.parked)
        assert "t" not in core.resident and core.engine.used_tokens() == 0
        waiting = core.state().parked[0]
        assert waiting.reason in ("environment", "ready")
        await _until(core, lambda: core.parked["t"].reason == "ready")
        await core.place(PlaceRequest(id="t", attempt=1, version=0, source=_self()))
        await _until(core, lambda: bool(core.finished))
        return core.finished[0]

    state = asyncio.run(run())
    turns = _texts(state)
    # Decoding went on past the call; what followed it was dropped.
    assert turns[:2] == [
        ("model", "Let me <tool>calc 2 + 3</tool>"),
        ("environment", "<result>5</result>"),
    ]
    assert turns[2][1].startswith(" so 5")
    assert state.generated == 60
    assert all(len(t.logprobs or []) == len(t.token_ids) for t in state.turns if t.role == "model")
    assert state.tool_calls_left == 1
    assert core.counts["tool_calls"] == 1


def _self() -> Source:
    return Pool().source("w")


def test_a_trajectory_waiting_for_its_environment_cannot_be_taken() -> None:
    gate = asyncio.Event()

    async def slow(rid: str, index: int, text: str, attempt: int) -> str:
        await gate.wait()
        return "<result>5</result>"

    core = _core(["<tool>calc 2 + 3</tool>"], slow, timeout_s=10.0)
    _place(core, "t")

    async def run() -> None:
        await _until(core, lambda: "t" in core.parked)
        with pytest.raises(Refused) as claimed:
            await core.claim("t", ClaimRequest(attempt=1, destination="x"))
        with pytest.raises(Refused) as placed:
            await core.place(PlaceRequest(id="t", attempt=1, version=0, source=_self()))
        assert claimed.value.reason == placed.value.reason == "environment"
        gate.set()
        await _until(core, lambda: core.parked["t"].reason == "ready")
        await core.claim("t", ClaimRequest(attempt=1, destination="x"))  # now it may move

    asyncio.run(run())


@pytest.mark.parametrize("behaviour", ["fails", "hangs"])
def test_an_environment_that_keeps_failing_ends_the_sample_failed(behaviour: str) -> None:
    asked: list[tuple[str, int]] = []

    async def broken(rid: str, index: int, text: str, attempt: int) -> str:
        asked.append((rid, index))
        if behaviour == "hangs":
            await asyncio.sleep(10)
        raise httpx.ConnectError("environment unreachable")

    core = _core(["<tool>calc 1 / 0</tool>"], broken)
    _place(core, "t")
    asyncio.run(_until(core, lambda: bool(core.finished)))
    assert asked == [("t", 0)] * 3  # every try is the same call, so an answer is idempotent
    assert core.counts["failed"] == 1 and core.counts["finished"] == 0
    assert not core.parked and not core.resident
    assert _texts(core.finished[0]) == [("model", "<tool>calc 1 / 0</tool>")]


def test_a_call_split_by_an_eviction_is_still_found() -> None:
    core = _core(["<tool>calc 6 * 7</tool>", "!"])
    _place(core, "t", max_tokens=30)

    async def run() -> TrajectoryState:
        await _until(core, lambda: core.state().residents[0].generated >= 12)
        core.evict("t")  # in the middle of "calc 6 * 7"
        await core.place(PlaceRequest(id="t", attempt=1, version=0, source=_self()))
        await _until(core, lambda: "t" in core.parked and core.parked["t"].reason == "ready")
        await core.place(PlaceRequest(id="t", attempt=2, version=0, source=_self()))
        await _until(core, lambda: bool(core.finished))
        return core.finished[0]

    state = asyncio.run(run())
    model = "".join(text for role, text in _texts(state) if role == "model")
    assert model.startswith("<tool>calc 6 * 7</tool>!")
    assert ("environment", "<result>42</result>") in _texts(state)


def test_no_call_is_answered_once_none_are_left() -> None:
    core = _core(["<tool>calc 1 + 1</tool>", " then <tool>calc 2 + 2</tool> ok"])
    _place(core, "t", max_tokens=80, calls=1)

    async def run() -> TrajectoryState:
        await _until(core, lambda: "t" in core.parked and core.parked["t"].reason == "ready")
        await core.place(PlaceRequest(id="t", attempt=1, version=0, source=_self()))
        await _until(core, lambda: bool(core.finished))
        return core.finished[0]

    state = asyncio.run(run())
    turns = _texts(state)
    assert [role for role, _ in turns] == ["model", "environment", "model"]
    assert state.turns[1].seconds is not None and state.turns[1].seconds >= 0  # timed
    assert turns[2][1].startswith(" then <tool>calc 2 + 2</tool> ok")


def test_a_call_that_uses_the_last_of_the_budget_ends_the_sample() -> None:
    core = _core(["<tool>calc 1 + 1</tool>"])
    _place(core, "t", max_tokens=len("<tool>calc 1 + 1</tool>"))
    asyncio.run(_until(core, lambda: bool(core.finished)))
    assert core.counts["tool_calls"] == 0 and core.counts["finished"] == 1
