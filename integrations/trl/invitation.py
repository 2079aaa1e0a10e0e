"""Where an external trainer reaches a `cadence run` in external mode: the run writes
`external.json` beside its files once its trainer serves (`operator/local/run.py`), and
the trainer's side reads it here. The file may not exist yet, or be half written, when
the trainer starts (both started from one shell line): `wait_for_invitation` waits for a
whole one, saying once what it waits for, and gives up after a timeout in one sentence."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError


class Invitation(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    url: str  # the run's trainer
    token_file: Path
    model: Path
    publish_dir: Path  # where published weights are left for the run to read


class NoInvitation(RuntimeError):
    """No whole invitation within the timeout; the message says where and why."""


def wait_for_invitation(
    path: Path,
    *,
    timeout_s: float = 300.0,
    poll_s: float = 0.5,
    said: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Invitation:
    deadline, told, why = clock() + timeout_s, False, "it does not exist"
    while True:
        try:
            found = Invitation.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            why = "it does not exist"
        except OSError as e:
            why = f"it cannot be read ({e.strerror or e})"
        except ValidationError:
            why = "it is not a whole invitation yet"
        else:
            return found
        if clock() >= deadline:
            raise NoInvitation(
                f"no run invitation at {path} after {timeout_s:.0f} s ({why}); start "
                "`cadence run` on a TrainingRun whose dataset is external first"
            )
        if not told:
            said(f"waiting for {path} ({why}): the run writes it once its trainer serves")
            told = True
        sleep(poll_s)
