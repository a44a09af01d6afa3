"""The artifact disk's state: free-space headroom, eviction to keep it, and the degraded flag.

A job's artifact is worth less than its audio stream: when the disk cannot take an artifact (full, an I/O
error, read-only), the job streams its audio to the end without one, and the store says why. `SpaceKeeper`
decides whether a new artifact may start (free space at or above `min_free_bytes`, evicting the oldest
artifacts older than `min_keep_s` first), records every artifact given up, and holds the store's *degraded*
state: set when an artifact cannot be written, cleared once the disk has its headroom again and a write
succeeds (a commit, or the probe that `refresh` writes while degraded). The worker reports the state in
`WorkerInfo`, in /metrics and in its log.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PROBE_NAME = ".art-probe.partial"  # a temp file name, so the start-up sweep removes one left by a crash
MIB = 1024 * 1024


@dataclass(frozen=True)
class StoreStatus:
    """What the health detail and /metrics show about the artifact disk."""

    degraded: bool
    reason: str  # why it is degraded ("" when it is not)
    free_bytes: int
    unavailable: dict  # artifacts given up since start, by cause: no_space, io_error, read_only, headroom, other
    evicted: int  # artifacts evicted since start to keep the free-space headroom


def os_error_cause(exc: OSError) -> tuple[str, str]:
    """(cause label, words for a person) of a failed artifact write."""
    code = exc.errno
    name = errno.errorcode.get(code, str(code)) if code is not None else "?"
    detail = f"{name}: {exc.strerror or exc}"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "no_space", f"the artifact disk is full ({detail})"
    if code == errno.EIO:
        return "io_error", f"the artifact disk reported an I/O error ({detail})"
    if code == errno.EROFS:
        return "read_only", f"the artifact disk is read-only ({detail})"
    return "other", f"the artifact disk failed ({detail})"


class SpaceKeeper:
    """Headroom, eviction and the degraded flag of one ArtifactStore (thread-safe)."""

    def __init__(self, store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._evict_lock = threading.Lock()
        self._reason = ""
        self._unavailable: dict[str, int] = {}
        self._evicted = 0

    @property
    def directory(self) -> Path:
        return self._store.directory

    def free_bytes(self) -> int:
        st = os.statvfs(self.directory)
        return st.f_bavail * st.f_frsize

    # ---- before an artifact starts ----
    def room_for_new_artifact(self) -> str | None:
        """None when a new artifact may start; else why not (the store is then degraded)."""
        need = self._store.settings.min_free_bytes
        try:
            free = self.free_bytes()
            if free < need:
                free = self.evict_to(need)
        except OSError as exc:  # the directory itself is unreachable
            return self.artifact_given_up(exc)
        if free >= need:
            return None
        reason = (f"the artifact disk has {free / MIB:.1f} MiB free, below the {need / MIB:.1f} MiB headroom "
                  f"(--artifact-min-free-bytes), and no artifact older than {self._store.settings.min_keep_s:g} s "
                  "is left to evict")
        self._count("headroom")
        self._set_degraded(reason)
        return reason

    def evict_to(self, need: int) -> int:
        """Delete the oldest artifacts older than min_keep_s until `need` bytes are free; returns the free bytes."""
        store = self._store
        with self._evict_lock:
            free = self.free_bytes()
            if free >= need:
                return free
            oldest_allowed_ns = time.time_ns() - int(store.settings.min_keep_s * 1e9)
            for record in store.committed_records():
                if free >= need:
                    break
                if int(record["committed_at_ns"]) > oldest_allowed_ns:
                    break  # sorted by commit time: every later one is younger too
                if store.discard(record["artifact_id"]):
                    with self._lock:
                        self._evicted += 1
                    log.warning("artifact %s evicted (committed %.0f s ago) to keep %.1f MiB free on the "
                                "artifact disk", record["artifact_id"],
                                (time.time_ns() - int(record["committed_at_ns"])) / 1e9, need / MIB)
                free = self.free_bytes()
            return free

    # ---- while and after writing ----
    def artifact_given_up(self, exc: OSError) -> str:
        """Record a failed artifact write; returns the words for the job's final message."""
        cause, words = os_error_cause(exc)
        self._count(cause)
        self._set_degraded(words)
        return words

    def write_succeeded(self) -> None:
        """A commit went through: the degraded state ends if the headroom is back."""
        if not self._reason:
            return
        try:
            ok = self.free_bytes() >= self._store.settings.min_free_bytes
        except OSError:
            ok = False
        if ok:
            self._clear_degraded("an artifact was committed")

    def refresh(self) -> None:
        """Periodic upkeep: evict to keep the headroom; while degraded, probe the disk with a small write."""
        need = self._store.settings.min_free_bytes
        try:
            free = self.evict_to(need) if need else self.free_bytes()
        except OSError as exc:
            self._set_degraded(os_error_cause(exc)[1])
            return
        if free < need:
            self._set_degraded(f"the artifact disk has {free / MIB:.1f} MiB free, below the {need / MIB:.1f} MiB "
                               "headroom (--artifact-min-free-bytes)")
            return
        if self._reason:
            try:
                self._probe()
            except OSError as exc:
                self._set_degraded(os_error_cause(exc)[1])
                return
            self._clear_degraded("a test write succeeded")

    def _probe(self) -> None:
        path = self.directory / PROBE_NAME
        try:
            with open(path, "wb") as f:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
        finally:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    # ---- state ----
    def status(self) -> StoreStatus:
        try:
            free = self.free_bytes()
        except OSError:
            free = 0
        with self._lock:
            return StoreStatus(bool(self._reason), self._reason, free, dict(self._unavailable), self._evicted)

    def _count(self, cause: str) -> None:
        with self._lock:
            self._unavailable[cause] = self._unavailable.get(cause, 0) + 1

    def _set_degraded(self, reason: str) -> None:
        with self._lock:
            was, self._reason = self._reason, reason
        if not was:
            log.warning("artifact store DEGRADED: %s. Jobs still stream their audio; they get no artifact while "
                        "this lasts (JobFinished.artifact_unavailable says why)", reason)

    def _clear_degraded(self, why: str) -> None:
        with self._lock:
            was, self._reason = self._reason, ""
        if was:
            log.warning("artifact store recovered (%s): artifacts are written again", why)
