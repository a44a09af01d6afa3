"""The store's system calls (artifacts/syscalls.py) against the kernel they bind: what each one reports is
checked by the kernel's own state (page-cache counts read with a call of the test's own, a file's durability
left to the kernel), on the Linux these tests run on (syncfs needs 5.8, cachestat 6.5)."""

from __future__ import annotations

import ctypes
import os
import platform
import re

import pytest

from breeze_worker.artifacts import syscalls

PAGES = 3


def _kernel_at_least(major: int, minor: int) -> bool:
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return platform.system() == "Linux" and found is not None and (int(found[1]), int(found[2])) >= (major, minor)


needs_cachestat = pytest.mark.skipif(not _kernel_at_least(6, 5), reason="cachestat needs Linux 6.5")


def _dirty_pages(fd: int, nbytes: int) -> int:
    """The kernel's count of dirty pages among the file's first `nbytes` (cachestat called here, not through
    the module under test: a 5-field result after a 2-field range)."""
    rng = (ctypes.c_uint64 * 2)(0, nbytes)
    stat = (ctypes.c_uint64 * 5)()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(451, fd, ctypes.byref(rng), ctypes.byref(stat), 0) != 0:
        raise OSError(ctypes.get_errno(), "cachestat")
    return int(stat[1])


def _written(tmp_path, name: str = "f") -> int:
    fd = os.open(tmp_path / name, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, os.urandom(PAGES * syscalls.PAGE_BYTES))
    return fd


def test_syncfs_flushes_the_volume_on_this_kernel(tmp_path):
    assert _kernel_at_least(5, 8) and syscalls.syncfs_usable()
    fd = _written(tmp_path)
    try:
        assert syscalls.syncfs(fd) is True
        if _kernel_at_least(6, 5):
            assert _dirty_pages(fd, PAGES * syscalls.PAGE_BYTES) == 0
    finally:
        os.close(fd)


def test_a_failed_syncfs_says_false_so_the_caller_syncs_file_by_file(tmp_path, caplog):
    fd = _written(tmp_path)
    os.close(fd)  # a closed descriptor: the kernel refuses the call (EBADF)
    with caplog.at_level("WARNING", logger="breeze_worker.artifacts.syscalls"):
        assert syscalls.syncfs(fd) is False
    assert "syncing file by file" in caplog.text


@needs_cachestat
def test_unsynced_bytes_counts_what_the_kernel_still_has_to_write(tmp_path):
    fd = _written(tmp_path)
    size = PAGES * syscalls.PAGE_BYTES
    try:
        before = syscalls.unsynced_bytes(fd, size)
        assert before == size  # every page dirty (or already under write-back: counted too)
        assert syscalls.unsynced_bytes(fd, size - 100) == size - 100  # capped at the size asked about
        os.fsync(fd)
        assert syscalls.unsynced_bytes(fd, size) == 0
    finally:
        os.close(fd)
    assert syscalls.counts_unsynced(tmp_path)


@needs_cachestat
def test_sync_file_range_starts_the_write_back_of_the_range_it_names(tmp_path):
    function = syscalls.libc_sync_file_range()
    assert function is not None
    fd = _written(tmp_path)
    page = syscalls.PAGE_BYTES
    try:
        assert function(fd, 0, page, syscalls.SYNC_FILE_RANGE_WRITE) == 0
        assert _dirty_pages(fd, page) == 0  # submitted: under write-back or written, no longer dirty
    finally:
        os.close(fd)


def test_fsync_dir_makes_a_directory_durable_and_names_a_missing_one(tmp_path):
    (tmp_path / "a").write_bytes(b"x")
    os.replace(tmp_path / "a", tmp_path / "b")
    syscalls.fsync_dir(tmp_path)
    with pytest.raises(FileNotFoundError):
        syscalls.fsync_dir(tmp_path / "missing")
