"""Pydantic's refusals as a person reads them: where, in the words of the file, and why.

Pydantic locates an error by position (`groups.0.devices`) and says of an unknown key only
that it is not permitted. A user wrote names, not positions, and usually mistyped a field
rather than invented one: `first_complaint` names a list item by its `name` (or `id`)
when it has one (`groups[l40s].devices`) and suggests the nearest field the model knows
at that place ("did you mean prompts_per_batch?"). Every command and the operator word
their refusals through it, so a file refused by `cadence sim`, `cadence run` or the
operator reads the same.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError


def where(loc: Sequence[int | str], data: object) -> str:
    """`loc` as a path through `data`: keys joined by dots, a list item by its name (or
    id) in brackets where it has one, else by its index."""
    out = ""
    node: Any = data
    for part in loc:
        if isinstance(part, int):
            item = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            name = (
                next((item[k] for k in ("name", "id") if k in item), None)
                if isinstance(item, Mapping)
                else None
            )
            out += f"[{name}]" if isinstance(name, str) and name else f"[{part}]"
            node = item
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, Mapping) else None
    return out


def first_complaint(
    error: ValidationError, data: object = None, model: type[BaseModel] | None = None
) -> tuple[str, str]:
    """(where, what) of pydantic's first complaint: `where` as `where` gives it ("" at the
    top level), `what` its message, with a suggestion for an unknown field when `model`
    knows one close to it."""
    first = error.errors()[0]
    loc = tuple(first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden" and model is not None and loc:
        known = _fields_at(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), sorted(known), n=1, cutoff=0.6)
        message = f"{loc[-1]!r} is not a field here"
        if close:
            message += f"; did you mean {close[0]}?"
    more = error.error_count() - 1
    if more:
        message += f" (and {more} more)"
    return where(loc, data), message


def _fields_at(model: type[BaseModel], loc: Sequence[int | str]) -> set[str]:
    """The keys the models reachable along `loc` accept (names and aliases)."""
    models: set[type[BaseModel]] = {model}
    for part in loc:
        if isinstance(part, int):
            continue  # an item: its list's models were reached with the list's field
        reached: set[type[BaseModel]] = set()
        for m in models:
            for name, info in m.model_fields.items():
                if part in (name, info.alias, info.validation_alias):
                    reached.update(_models_in(info.annotation))
        models = reached
    keys: set[str] = set()
    for m in models:
        for name, info in m.model_fields.items():
            keys.add(info.alias if isinstance(info.alias, str) else name)
    return keys


def _models_in(annotation: object) -> Iterable[type[BaseModel]]:
    """The pydantic models inside a field's type: itself, or in its list, dict, union or
    Annotated arguments."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    origin = typing.get_origin(annotation)
    if origin is None and not isinstance(annotation, types.UnionType):
        return
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)
