"""Real file systems for storage-fault tests: a size-limited tmpfs mounted from outside the worker (root)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from host_tools import need_tool


@contextlib.contextmanager
def small_tmpfs(path: Path, size_bytes: int):
    """Mount a tmpfs of `size_bytes` at `path` for the block; writes past it fail with ENOSPC in the kernel."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([need_tool("mount"), "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"mounting a tmpfs needs root: {done.stderr.strip()}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave_bytes: int = 0, name: str = "hog.bin") -> Path:
    """Fill the file system at `path` (from this process, not the worker) until `leave_bytes` remain."""
    hog = path / name
    fd = os.open(hog, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while (free := free_bytes(path)) > leave_bytes:
            try:
                os.write(fd, b"\xff" * max(4096, min(1 << 20, free - leave_bytes)))
            except OSError:  # full: what fit stays
                break
    finally:
        os.close(fd)
    return hog
