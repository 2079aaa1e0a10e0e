"""The reference calculator environment: the documented tool-call format, arithmetic
only (overflow is an error observation, never a 500), answers idempotent per call of one
attempt, and only for callers with the pool's token."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cadence.worker.calculator import create_app, evaluate, find_tool_call, observation

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


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
        # Exact, not in floats: 10**17 + 1 keeps its last digit; 10**18 + 1 is past the bound.
        ("10**17 + 1", "<result>100000000000000001</result>"),
        ("10**18 + 1", "<result>error: result out of range</result>"),
        ("0.1 + 0.2", "<result>0.3</result>"),
    ],
)
def test_only_arithmetic_is_evaluated(expression: str, shown: str) -> None:
    assert observation(expression) == shown


def test_evaluate_refuses_overlong_expressions() -> None:
    with pytest.raises(ValueError, match="longer than"):
        evaluate("1+" * 200 + "1")


@pytest.mark.parametrize(
    "expression",
    ["1e300**2", "(-1e300)**3", "1e400", "-1e400", "1e400 - 1e400", "2 * 1e400"],
)
def test_overflow_and_infinities_are_an_error_observation(expression: str) -> None:
    assert observation(expression) == "<result>error: result out of range</result>"


def _post(calls: list[tuple[dict[str, object], dict[str, str]]]) -> list[httpx.Response]:
    """Each (body, headers) posted to one environment in turn."""
    transport = httpx.ASGITransport(app=create_app(TOKEN), raise_app_exceptions=False)

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=transport, base_url="http://env") as http:
            return [await http.post("/v1/tool", json=c, headers=h) for c, h in calls]

    return asyncio.run(go())


CALL = {"trajectory_id": "t", "attempt": 0, "call_index": 0, "text": "<tool>calc 6*7</tool>"}


def test_an_overflowing_call_is_answered_with_the_error_not_a_500() -> None:
    (r,) = _post([({**CALL, "text": "<tool>calc 1e300**2</tool>"}, AUTH)])
    assert r.status_code == 200
    assert r.json() == {"observation": "<result>error: result out of range</result>"}


def test_the_service_answers_once_per_call_and_refuses_malformed_bodies() -> None:
    first, again, bad = _post(
        [
            (CALL, AUTH),
            ({**CALL, "text": "<tool>calc 1</tool>"}, AUTH),
            ({"trajectory_id": "t"}, AUTH),
        ]
    )
    assert first.json() == {"observation": "<result>42</result>"}
    assert again.json() == first.json()  # a retried call gets the same answer
    assert bad.status_code == 422 and bad.json()["reason"] == "invalid"


def test_a_new_attempt_of_a_trajectory_gets_its_own_answers() -> None:
    """A trajectory re-run from its start (a new attempt) asks call 0 again with other
    text: it gets its own answer, not the one its earlier attempt got first; the earlier
    attempt's retries still get theirs."""
    old, new, old_again = _post(
        [
            (CALL, AUTH),
            ({**CALL, "attempt": 1, "text": "<tool>calc 2+3</tool>"}, AUTH),
            (CALL, AUTH),
        ]
    )
    assert old.json() == {"observation": "<result>42</result>"}
    assert new.json() == {"observation": "<result>5</result>"}
    assert old_again.json() == old.json()


def test_a_caller_without_the_token_is_refused_and_cannot_poison_an_answer() -> None:
    forged = {**CALL, "text": "<tool>calc 666</tool>"}
    none, wrong, real = _post(
        [(forged, {}), (forged, {"Authorization": "Bearer guess"}), (CALL, AUTH)]
    )
    assert (none.status_code, none.json()["reason"]) == (401, "unauthorised")
    assert (wrong.status_code, wrong.json()["reason"]) == (401, "unauthorised")
    assert real.json() == {"observation": "<result>42</result>"}
