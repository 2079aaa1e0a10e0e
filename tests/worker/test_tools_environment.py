"""A worker's calls to its environment: they carry the pool's bearer token (the
environment refuses callers without it) and the trajectory's attempt (the environment
keeps answers per call of one attempt)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import uvicorn

from cadence.common import web
from cadence.worker import calculator, serve
from cadence.worker.tools import HttpEnvironment, ToolUse
from tests.helpers import eventually_async

from .factories import FakeClock, free_port

TOKEN = "s3cret"


def test_each_call_names_the_trajectory_its_attempt_and_the_call() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"observation": "<result>5</result>"})

    environment = HttpEnvironment("http://env", TOKEN, transport=httpx.MockTransport(answer))
    decode, encode = (lambda ids: "".join(map(chr, ids))), (lambda text: [ord(c) for c in text])
    tools = ToolUse(decode, encode, environment, FakeClock())
    tokens = asyncio.run(tools.observe("t", 2, "<tool>calc 2+3</tool>", attempt=3))
    assert tokens == [ord(c) for c in "<result>5</result>"]
    (request,) = seen
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    body = json.loads(request.content)
    assert (body["trajectory_id"], body["attempt"], body["call_index"]) == ("t", 3, 2)


def test_a_worker_is_answered_by_an_environment_that_takes_the_pools_token(
    tiny_model: Path,
) -> None:
    """`cadence worker --env-url` against the reference environment over HTTP, as a pod
    calls the calculator beside the trainer: the call is answered, not refused 401."""
    port = free_port()
    config = uvicorn.Config(
        calculator.create_app(TOKEN), host="127.0.0.1", port=port, log_level="warning"
    )
    server = web.EmbeddedServer(config)

    async def started() -> bool:
        return server.started

    async def go() -> str:
        running = asyncio.create_task(server.serve())
        try:
            await eventually_async(started, timeout_s=10, what="the environment serving")
            options = serve.WorkerOptions(
                worker_id="w0",
                accelerator="H800",
                affinity=0,
                model="Qwen3-8B",
                model_path=tiny_model,
                token=TOKEN,
                env_url=f"http://127.0.0.1:{port}",
                env_tries=1,
            )
            tools = serve.build(options).tools
            assert tools is not None
            tokens = await tools.observe("t", 0, "<tool>calc 6*7</tool>", attempt=1)
            assert tokens is not None, "the environment refused or failed the call"
            return tools.decode(tokens)
        finally:
            server.should_exit = True
            await running

    assert asyncio.run(go()) == "<result>42</result>"
