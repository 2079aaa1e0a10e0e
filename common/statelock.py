"""One owner per state directory. A trainer's ledger and weights, and a `cadence run`'s
work directory, are written by one process at a time: two trainers on one ledger would
train the same batches and overwrite each other's published weights. The lock is an
advisory `flock` on a file in the directory, so the kernel drops it when its process
dies, however it dies (a killed trainer's replacement takes it at once), and a second
owner is refused at start in one sentence that names the holder."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


class StateInUse(RuntimeError):
    """Another live process holds the directory."""


class StateLock:
    def __init__(self, path: Path, what: str) -> None:
        """Take `path`'s lock for `what` (a phrase: "the trainer state directory X"), or
        raise StateInUse."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[str] | None = path.open("a+")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "unknown"
            self._file.close()
            self._file = None
            raise StateInUse(f"{what} is in use by another process (pid {holder})") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"{os.getpid()}\n")
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the file drops the lock
            self._file = None
