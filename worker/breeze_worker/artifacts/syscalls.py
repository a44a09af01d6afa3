"""The artifact store's system calls, each with what to do where the kernel lacks it.

- `syncfs`: one flush of the whole volume for a group of files (Linux 5.8 and later, where it reports
  write-back errors); False elsewhere, and the caller syncs file by file.
- `libc_sync_file_range`: starts the kernel's write-back of a file's range without waiting (the store's
  write-back thread calls it); None where the C library lacks it.
- `unsynced_bytes`: the bytes of a file the kernel still has to write (`cachestat`, Linux 6.5 and later);
  None where it cannot say. `counts_unsynced` tries it once on a directory's volume.
- `fsync_dir`: makes a directory's entries (a rename) durable.

Nothing here knows about artifacts: the store (store.py) decides what to sync, when, and what a failure means.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import re
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SYNC_FILE_RANGE_WRITE = 2  # start write-back of the range's dirty pages; wait for nothing
PAGE_BYTES = mmap.PAGESIZE  # write-back moves whole pages: a hint ends at the last page already written whole


def syncfs_usable() -> bool:
    """syncfs reports write-back errors since Linux 5.8; before, it could return success after a failed
    write-back, so it is used only there."""
    system = os.uname()
    if system.sysname != "Linux":
        return False
    found = re.match(r"(\d+)\.(\d+)", system.release)
    return found is not None and (int(found.group(1)), int(found.group(2))) >= (5, 8)


@functools.cache
def _libc_syncfs():
    """The C library's syncfs, where it is usable (`syncfs_usable`); else None."""
    if not syncfs_usable():
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    return function


def syncfs(fd: int) -> bool:
    """Flush the whole file system holding `fd` (one call for a group of files); False when syncfs is not
    usable here or failed (the caller syncs file by file, which names the failing file)."""
    function = _libc_syncfs()
    if function is None:
        return False
    if function(fd) != 0:
        log.warning("syncfs on the artifact volume failed (%s); syncing file by file",
                    os.strerror(ctypes.get_errno()))
        return False
    return True


@functools.cache
def libc_sync_file_range():
    """The C library's sync_file_range (Linux), else None."""
    if os.uname().sysname != "Linux":
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


CACHESTAT_SYSCALL = 451  # Linux 6.5+; one number on x86-64 and arm64 (and every architecture of the generic table)


class _CacheRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]  # len 0: to the end of the file


class _CacheStat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64)
                for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


@functools.cache
def _libc_syscall():
    """The C library's `syscall` where cachestat's number is known (Linux on x86-64 or arm64), else None."""
    if os.uname().sysname != "Linux" or os.uname().machine not in ("x86_64", "aarch64"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_long
    return function


def unsynced_bytes(fd: int, size: int) -> int | None:
    """Of the file's first `size` bytes, those the kernel still has to write to the volume: its pages that are
    dirty or under write-back (cachestat), counted whole and capped at `size`. None where the kernel cannot say
    (before Linux 6.5, another system, a call refused)."""
    function = _libc_syscall()
    if function is None:
        return None
    stat = _CacheStat()
    if function(CACHESTAT_SYSCALL, ctypes.c_uint(fd), ctypes.byref(_CacheRange(0, 0)), ctypes.byref(stat),
                ctypes.c_uint(0)) != 0:
        return None
    return min(size, (stat.nr_dirty + stat.nr_writeback) * PAGE_BYTES)


def counts_unsynced(directory: Path) -> bool:
    """Whether `unsynced_bytes` answers for files in `directory` (tried once on a file of its own)."""
    try:
        with tempfile.TemporaryFile(dir=directory) as f:
            f.write(b"\0")
            f.flush()
            return unsynced_bytes(f.fileno(), 1) is not None
    except OSError:
        return False


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
