"""Verifiers: the math checker's extraction and normalisation, format, the toy task."""

from __future__ import annotations

import pytest

from cadence.trainer.rewards import digits_reward, extract_answer, format_reward, math_reward


@pytest.mark.parametrize(
    ("text", "answer", "reward"),
    [
        ("so the answer is \\boxed{42}.", "42", 1.0),
        ("first 3, then \\boxed{1,234}", "1234", 1.0),
        ("the result is 0.50", "1/2", 1.0),
        ("I get 7 and then 8.", "8", 1.0),
        ("\\boxed{41} though 42 appears", "42", 0.0),
        ("no number here", "3", 0.0),
        ("<result>6</result> so \\boxed{ 6 }", "6", 1.0),
    ],
)
def test_math_reward(text: str, answer: str, reward: float) -> None:
    assert math_reward(text, answer) == reward


def test_extraction_prefers_the_last_boxed_answer() -> None:
    assert extract_answer("\\boxed{1} and \\boxed{2} then 3") == "2"
    assert extract_answer("none") is None


def test_format_and_digits() -> None:
    assert format_reward("\\boxed{3}", "") == 1.0
    assert format_reward("\\boxed{3} \\boxed{4}", "") == 0.0
    assert digits_reward("7777 7777 7777 7777 and more", "7") == 1.0
    assert digits_reward(" 277" * 8, "7") == pytest.approx(10 / 16)  # "2772772772772772"
    assert digits_reward("77", "7") == 2 / 16  # what is missing counts as wrong
    assert digits_reward("", "7") == 0.0
