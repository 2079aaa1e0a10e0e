"""Reading a user's input file whole, with a bound: a scenario, a resource file. A path
such as `/dev/zero` never ends, and a mistaken multi-gigabyte file would be read into
memory before any parser could refuse it; past the bound the read stops and the caller's
usual "cannot read" sentence says why (an OSError with its strerror)."""

from __future__ import annotations

import errno
from pathlib import Path

MAX_INPUT_BYTES = 64 << 20  # no scenario or resource file is near it


def read_input(path: Path, limit: int = MAX_INPUT_BYTES) -> bytes:
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"it is larger than {limit} bytes", str(path))
    return data
