"""Errors read as sentences: never `ReadTimeout: ` with nothing after it."""

from __future__ import annotations

import asyncio

import httpx

from cadence.common.errors import describe


def test_a_timeout_says_what_timed_out_and_which_call() -> None:
    async def never_answers(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("", request=request)

    async def call() -> BaseException:
        async with httpx.AsyncClient(transport=httpx.MockTransport(never_answers)) as http:
            try:
                await http.get("http://trainer:8100/v1/ledger")
            except httpx.HTTPError as e:
                return e
        raise AssertionError("the call answered")

    said = describe(asyncio.run(call()))
    assert said == ("ReadTimeout: no answer within the timeout (GET http://trainer:8100/v1/ledger)")


def test_an_error_with_a_message_keeps_it() -> None:
    assert describe(KeyError("token")) == "KeyError: 'token'"
    assert describe(RuntimeError()) == "RuntimeError: no detail given"
