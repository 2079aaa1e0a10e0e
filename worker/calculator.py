"""The reference environment for multi-turn tasks: a calculator behind HTTP.

Tool-call format (what a model writes, and what the worker looks for in its text):

    <tool>calc 18 / (1 + 2)</tool>

The environment answers with the observation the worker appends to the trajectory:

    <result>6</result>        or        <result>error: division by zero</result>

Expressions are arithmetic only: numbers, + - * / // % **, unary signs and parentheses,
evaluated on Python's AST with every other node refused, so a model cannot reach names,
calls or attributes. A value out of range (an overflow, an infinity) is an error
observation like division by zero, never a failed request.

An answer is idempotent per (trajectory, attempt, call index): a worker that retries a
call gets the same observation, and a trajectory run again from its start under a new
attempt gets its own. Only the pool's workers may call: the service takes the pool's
bearer token and bounds bodies as the worker and the trainer do (`common/web.py`), since
a first answer is kept, and a caller able to ask first could otherwise choose what
another trajectory is told.
"""

from __future__ import annotations

# `_operator`, not `operator`: this repository's operator/ package shadows the name for
# mypy (see operator/__init__.py).
import _operator as operator
import ast
import math
import re
from collections.abc import Callable
from fractions import Fraction

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from cadence.common import web

TOOL_CALL = re.compile(r"<tool>\s*calc\s+(?P<expr>.*?)</tool>", re.DOTALL)
MAX_EXPRESSION = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**18
MAX_ANSWERS = 100_000  # answers kept for retries; the oldest go first

# Exact where it can be: integers and ratios are Fractions (so 10**18 + 1 is not
# 10**18), and only a fractional power leaves them, as a float.
Number = Fraction | float

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.UAdd: lambda x: x,
    ast.USub: lambda x: -x,
}


class CalcError(ValueError):
    """The expression is not arithmetic, or its value is out of bounds."""


def find_tool_call(text: str) -> str | None:
    """The expression of the first complete tool call in `text`, if any."""
    match = TOOL_CALL.search(text)
    return match.group("expr").strip() if match else None


def evaluate(expression: str) -> Number:
    if len(expression) > MAX_EXPRESSION:
        raise CalcError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise CalcError("not an arithmetic expression") from None
    return _eval(tree.body)


def _eval(node: ast.expr) -> Number:
    value = node.value if isinstance(node, ast.Constant) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return _in_range(Fraction(value))
    if isinstance(value, float):
        if not math.isfinite(value):  # `1e400` parses as infinity
            raise CalcError("result out of range")
        return _in_range(Fraction(repr(value)))  # 0.1 as written, not its binary value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(float(right)) > MAX_EXPONENT:
            raise CalcError(f"exponent above {MAX_EXPONENT}")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        except OverflowError:  # float ** raises where * gives infinity
            raise CalcError("result out of range") from None
        if isinstance(result, complex):
            raise CalcError("result out of range")
        return _in_range(result)
    raise CalcError(f"{type(node).__name__} is not allowed")


def _in_range(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError("result out of range")
    if abs(Fraction(value)) > MAX_MAGNITUDE:
        raise CalcError("result out of range")
    return value


def observation(expression: str) -> str:
    try:
        value = evaluate(expression)
    except CalcError as e:
        return f"<result>error: {e}</result>"
    if isinstance(value, Fraction) and value.denominator == 1:
        shown = str(value.numerator)
    else:
        shown = f"{float(value):.6g}"
    return f"<result>{shown}</result>"


class ToolRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    trajectory_id: str = Field(min_length=1, max_length=200)
    attempt: int = Field(default=0, ge=0)  # the trajectory's attempt (placement) number
    call_index: int = Field(ge=0)
    text: str = Field(max_length=4096)  # the model's text holding the tool call


class ToolResponse(BaseModel):
    observation: str


def create_app(token: str) -> FastAPI:
    """The environment's API, for callers holding the pool's bearer `token`."""
    app = FastAPI(title="Cadence reference calculator environment", version="v1")
    guarded = web.install(app, token)
    answered: dict[tuple[str, int, int], str] = {}

    @app.post("/v1/tool", dependencies=guarded)
    async def tool(body: ToolRequest) -> ToolResponse:
        key = (body.trajectory_id, body.attempt, body.call_index)
        if key not in answered:
            if len(answered) >= MAX_ANSWERS:
                del answered[next(iter(answered))]
            expression = find_tool_call(body.text)
            answered[key] = (
                observation(expression)
                if expression is not None
                else "<result>error: no <tool>calc ...</tool> call found</result>"
            )
        return ToolResponse(observation=answered[key])

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
