"""Verifiers: a sample's text (and its task's answer) in, a reward in [0, 1] out.

Pluggable by name (`VERIFIERS`): a trainer is configured with one. Each is a pure
function of the completion's text and the answer stored with its group in the ledger.

- `math`: the final answer (the last `\\boxed{...}`, else the last number in the text)
  compared with the reference after normalisation (spaces, thousands separators, a
  trailing period, equal numeric values such as `0.50` and `1/2`): 1 or 0.
- `format`: 1 when the completion has exactly one `\\boxed{...}` answer, else 0.
- `digits`: the toy task the learning test uses (see `task.py`): the share of the
  completion's first characters that are the answer's digit.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

Verifier = Callable[[str, str], float]

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def extract_answer(text: str) -> str | None:
    """The last boxed answer, else the last number in `text`."""
    boxed = _BOXED.findall(text)
    if boxed:
        return str(boxed[-1])
    numbers = _NUMBER.findall(text)
    return str(numbers[-1]) if numbers else None


def normalise(answer: str) -> str:
    text = answer.strip().rstrip(".").replace(" ", "").replace("$", "")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return text.lower()
    return str(value)  # 0.50, 1/2 and .5 all become "1/2"


def math_reward(text: str, answer: str) -> float:
    found = extract_answer(text)
    return 1.0 if found is not None and normalise(found) == normalise(answer) else 0.0


def format_reward(text: str, answer: str) -> float:
    return 1.0 if len(_BOXED.findall(text)) == 1 else 0.0


DIGITS_CHARS = 16


def digits_reward(text: str, answer: str) -> float:
    """Share of the first DIGITS_CHARS characters of `text`, spaces left out, that are
    the digit `answer` (missing characters count as wrong)."""
    head = text.replace(" ", "")[:DIGITS_CHARS]
    return sum(c == answer for c in head) / DIGITS_CHARS


VERIFIERS: dict[str, Verifier] = {
    "math": math_reward,
    "format": format_reward,
    "digits": digits_reward,
}
