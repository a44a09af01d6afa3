"""One worker per artifact directory: an exclusive lock on a file in the directory, held for the store's life.

The store's start-up sweep removes every temp file as something a crashed run left, which is true only when no
other worker writes there: a second worker started on the same directory (a mistaken restart, a second unit, a
copy-pasted command) would delete the first one's jobs in progress. So the store takes this lock before it
touches anything in the directory, and a second store on a locked directory refuses at once.

The lock is `flock(LOCK_EX | LOCK_NB)` on `LOCK_NAME`. The kernel holds it for the open file, so it ends with
the process however the process ends (kill -9, out of memory): a lock file left by a dead worker is not
locked, and the next worker takes it over. That is what makes recovering a stale lock safe; nothing is
decided from the file's contents. The contents (the holder's pid, host, start time and addresses, as JSON)
only let the refusal say who holds the directory. The file is never removed: removing it while another
process waits to lock it would let two processes each lock a file of that name.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_NAME = ".breeze-worker.lock"


class DirectoryInUse(OSError):
    """The artifact directory is locked by another worker (or another store of this process)."""


def _describe(holder: dict) -> str:
    """The holder's record in words: 'pid 123 on host h, synthesis 127.0.0.1:50051, ..., since ...'."""
    if not holder:
        return "a worker whose record is not written yet (it is starting)"
    words = [f"pid {holder.get('pid', '?')}"]
    if holder.get("host"):
        words[0] += f" on host {holder['host']}"
    for name in ("synthesis", "artifacts", "metrics"):
        if holder.get(name):
            words.append(f"{name} {holder[name]}")
    if holder.get("started"):
        words.append(f"since {holder['started']}")
    return ", ".join(words)


def _read(fd: int) -> dict:
    """The record in an open lock file ({} when empty or unreadable: the holder may be writing it)."""
    try:
        raw = os.pread(fd, 64 * 1024, 0)
        record = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


class DirectoryLock:
    """The held lock of one artifact directory; `release` (or the process's end) lets it go."""

    def __init__(self, directory: Path, fd: int, record: dict) -> None:
        self.directory = directory
        self._fd: int | None = fd
        self.record = record

    @classmethod
    def acquire(cls, directory: Path, holder: dict | None = None) -> DirectoryLock:
        """Lock `directory` for this process, or raise DirectoryInUse naming the directory and its holder.
        `holder`: addresses to record besides the pid, host and start time (`update` adds them later)."""
        path = directory / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OSError(f"cannot create the artifact directory's lock file {path} ({exc.strerror}): the "
                          "directory must be writable by the worker") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            found = _read(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OSError(f"cannot lock the artifact directory {directory} ({path}): {exc.strerror}") from exc
            raise DirectoryInUse(
                f"the artifact directory {directory} is in use by another worker ({_describe(found)}); one worker "
                f"per artifact directory, since each removes the unfinished files it finds there at start-up. "
                f"Stop that worker first, or give this one its own --artifact-dir") from None
        previous = _read(fd)
        if previous:  # `release` empties the record: this holder ended without it (killed, crashed)
            log.info("artifact directory %s: the previous worker (%s) ended without releasing it; its lock is "
                     "taken over", directory, _describe(previous))
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **(holder or {})}
        lock = cls(directory, fd, record)
        lock._write()
        return lock

    def update(self, **fields: str) -> None:
        """Record more about the holder (the addresses once bound); best effort: the lock is what counts."""
        self.record.update(fields)
        self._write()

    def _write(self) -> None:
        if self._fd is None:
            return
        data = json.dumps(self.record).encode()
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, data, 0)
        except OSError as exc:  # a full disk: the record is for messages only
            log.warning("could not write the artifact directory's lock record (%s); the lock is held", exc)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Empty the record and let the lock go (closing the file does); the file stays (see the module's
        docstring). A lock file with a record in it was left by a holder that never got here."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        finally:
            os.close(fd)

    def __del__(self) -> None:
        if self._fd is not None:  # a store let go of without `close` (tests)
            self.release()
