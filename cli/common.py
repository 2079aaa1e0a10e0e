"""What every `cadence` command module shares.

A command reports bad input by raising UsageError with the one sentence the user will
read; `main` prints it on stderr and exits 2 (RunFailed: exit 1). Parser makes argparse's
own complaints follow that rule, and the helpers here word the sentences for numbers,
JSON files and pydantic validation errors the same way in every command.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn, TypeAlias

import yaml
from pydantic import BaseModel, ValidationError

from cadence.common.complaints import first_complaint

PROG = "cadence"


class UsageError(Exception):
    """Bad input from the user: the message is the one sentence they will read."""


class RunFailed(Exception):
    """A run that could not go on (a child process that would not start): exit 1."""


class Parser(argparse.ArgumentParser):
    """Argparse, its complaints raised as UsageError instead of printed with the usage."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number no smaller than `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"expected a number of at least {minimum}, got {value}"
            )
        return value

    return parse


def output_file(text: str) -> Path:
    """An argparse type: a file to write, in a folder that exists (checked before any
    work is done, so that an hour's search is not lost to a mistyped folder)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name")
    if not path.absolute().parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder of {text} does not exist")
    return path


def output_folder(text: str) -> Path:
    """An argparse type: a folder to write into, made if missing under one that exists."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    if not path.absolute().parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder that would hold {text} does not exist")
    return path


def positive_number(text: str) -> float:
    """An argparse type: a positive, finite number."""
    return _positive(text, "a number", "")


def positive_seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    return _positive(text, "a number of seconds", " s")


def _positive(text: str, what: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text}{unit} must be positive and finite")
    return value


def read_json(path: Path, what: str) -> object:
    """The JSON in `path`, or a UsageError naming it as `what` (e.g. "snapshot")."""
    try:
        text = path.read_text()
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{what} {path} is not JSON: {e.msg} at line {e.lineno}") from None


def validation_sentence(
    what: str, path: Path, error: ValidationError, model: type[BaseModel] | None = None
) -> str:
    """The first of pydantic's complaints about `path` as one sentence, with a count of the
    rest: list items named as the file names them, an unknown field with the nearest one
    `model` knows."""
    where, message = first_complaint(error, _readable(path), model)
    return f"{what} {path} is invalid at {where or '(top level)'}: {message}"


def _readable(path: Path) -> object:
    """The file's data, to name its list items in a complaint; None if it cannot be read."""
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return None


# What a command module's add_* functions receive: the subparsers of `cadence` (or of
# `cadence bench`), each command registered with set_defaults(run=FUNCTION).
Commands: TypeAlias = "argparse._SubParsersAction[Parser]"


def setting_value(text: str) -> object:
    """A VALUE typed on the command line: none, true/false, a number, else the text."""
    if text.lower() == "none":
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def check_generated(files: Mapping[str, str], folder: Path, command: str) -> None:
    """RunFailed naming the files under `folder` that differ from what `command` would
    write (`files`: name -> text), so CI can tell a generated folder is stale."""
    stale = [
        name
        for name, text in files.items()
        if not (folder / name).is_file() or (folder / name).read_text() != text
    ]
    if stale:
        raise RunFailed(f"{folder} is stale ({', '.join(stale)}); run cadence {command}")
