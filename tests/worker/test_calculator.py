"""The reference calculator environment: the documented tool-call format, arithmetic
only, idempotent answers."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cadence.worker.calculator import create_app, evaluate, find_tool_call, observation


@pytest.mark.parametrize(
    ("text", "expression"),
    [
        ("so <tool>calc 18 / (1 + 2)</tool> then", "18 / (1 + 2)"),
        ("<tool> calc 2**10 </tool><tool>calc 1</tool>", "2**10"),
        ("no call here", None),
        ("<tool>calc 1 + 2", None),  # not closed yet
    ],
)
def test_tool_calls_are_found_in_model_text(text: str, expression: str | None) -> None:
    assert find_tool_call(text) == expression


@pytest.mark.parametrize(
    ("expression", "shown"),
    [
        ("18 / (1 + 2)", "<result>6</result>"),
        ("-3 * 4 + 7 % 5", "<result>-10</result>"),
        ("1 / 3", "<result>0.333333</result>"),
        ("1 / 0", "<result>error: division by zero</result>"),
        ("2 ** 1000", "<result>error: exponent above 64</result>"),
        ("__import__('os').system('true')", "<result>error: Call is not allowed</result>"),
        ("x + 1", "<result>error: Name is not allowed</result>"),
        ("1 +", "<result>error: not an arithmetic expression</result>"),
    ],
)
def test_only_arithmetic_is_evaluated(expression: str, shown: str) -> None:
    assert observation(expression) == shown


def test_evaluate_refuses_overlong_expressions() -> None:
    with pytest.raises(ValueError, match="longer than"):
        evaluate("1+" * 200 + "1")


def test_the_service_answers_once_per_call_and_refuses_malformed_bodies() -> None:
    transport = httpx.ASGITransport(app=create_app())

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=transport, base_url="http://env") as http:
            call = {"trajectory_id": "t", "call_index": 0, "text": "<tool>calc 6*7</tool>"}
            first = await http.post("/v1/tool", json=call)
            again = await http.post("/v1/tool", json={**call, "text": "<tool>calc 1</tool>"})
            bad = await http.post("/v1/tool", json={"trajectory_id": "t"})
            return [first, again, bad]

    first, again, bad = asyncio.run(go())
    assert first.json() == {"observation": "<result>42</result>"}
    assert again.json() == first.json()  # a retried call gets the same answer
    assert bad.status_code == 422
