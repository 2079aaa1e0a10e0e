"""One owner per state directory. A trainer's ledger and weights, and a `cadence run`'s
work directory, are written by one process at a time: two trainers on one ledger would
train the same batches and overwrite each other's published weights.

The lock is an advisory `flock` on the directory itself, not on a file in it: a lock
file can be deleted in passing ("a stale lock"), after which a second process locks a
new file of the same name while the first still runs. A directory that holds the
state cannot be unlinked while it holds it, and the kernel drops the lock when its
process dies, however it dies (a killed trainer's replacement takes it at once).

What remains is replacing the directory (renamed away, a new one made under its name):
the owner would then write into a directory it does not hold. `check()` compares the
path's inode with the locked one; owners call it before every write, and stop writing
(`StateLost`) once they no longer hold what the path names.

A note file in the directory names the holder's pid for the refusal's sentence; it is
only a note: deleting it changes nothing."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class StateInUse(RuntimeError):
    """Another live process holds the directory."""


class StateLost(RuntimeError):
    """The path no longer names the directory this process locked. A service answers it
    as a refusal (`web.install`'s `refusals`): 503, with this reason."""

    status = 503
    reason = "state_lost"


class StateLock:
    def __init__(self, directory: Path, what: str, *, note: str) -> None:
        """Lock `directory` for `what` (a phrase: "the trainer state directory X"), or raise
        StateInUse. `note` is the file in it that names the holder."""
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.what = what
        self.note = directory / note
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self._holder()
            raise StateInUse(f"{what} is in use by another process (pid {holder})") from None
        self._fd: int | None = fd
        held = os.fstat(fd)
        self._identity = (held.st_dev, held.st_ino)
        self._write_note()

    def _holder(self) -> str:
        try:
            return self.note.read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def _write_note(self) -> None:
        partial = self.note.with_name(self.note.name + ".partial")
        partial.write_text(f"{os.getpid()}\n")
        os.replace(partial, self.note)

    def check(self) -> None:
        """Raise StateLost unless this process still holds the directory the path names."""
        if self._fd is None:
            raise StateLost(f"{self.what} is no longer held by this process")
        try:
            now = os.stat(self.directory)
        except OSError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != self._identity:
            raise StateLost(
                f"{self.directory} was removed or replaced under this process; it no longer "
                f"owns {self.what} and stops writing to it"
            )

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None
