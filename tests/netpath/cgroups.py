"""Faults from the kernel for the retrieval-diagnosis tests: a throttled disk and a CPU quota.

`LoopVolume` is an ext4 file system in a file, loop-mounted on a temporary directory. `Cgroup("io")`
limits a process's reads and writes to one block device (cgroup v1 `blkio.throttle.*_bps_device`, or v2
`io.max`), `Cgroup("cpu")` its CPU time (v1 `cpu.cfs_quota_us`, v2 `cpu.max`). A process joins with
`add(pid)` and goes back to the cgroup it came from with `restore(pid)`. An I/O limit on the loop device
slows only that device: a test process can join while its other files live elsewhere.

`io_limit_support()` / `cpu_limit_support()` say which mechanism this machine offers ("" when none: no root,
no loop devices, or the controller is neither mounted as v1 nor enabled in v2); the tests then fall back
to test-only settings and say so. Everything made here is removed on exit.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
_V1_DIRS = {"io": ("blkio",), "cpu": ("cpu", "cpu,cpuacct")}
_counter = itertools.count()


def _run(*cmd: str) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def _v1_root(controller: str) -> Path | None:
    for name in _V1_DIRS[controller]:
        path = ROOT / name
        probe = "blkio.throttle.write_bps_device" if controller == "io" else "cpu.cfs_quota_us"
        if (path / probe).exists():
            return path
    return None


def _v2_root(controller: str) -> Path | None:
    for path in (ROOT, ROOT / "unified"):
        controllers = path / "cgroup.controllers"
        if controllers.exists() and controller in controllers.read_text().split():
            return path
    return None


def _support(controller: str) -> str:
    if os.geteuid() != 0:
        return ""
    if _v1_root(controller) is not None:
        return "v1"
    if _v2_root(controller) is not None:
        return "v2"
    return ""


def io_limit_support() -> str:
    """'v1 blkio' / 'v2 io.max' when a loop device's bandwidth can be limited here, else ''."""
    tools = all(shutil.which(t) for t in ("losetup", "mkfs.ext4", "mount", "umount"))
    version = _support("io") if tools and Path("/dev/loop-control").exists() else ""
    return {"v1": "cgroup v1 blkio.throttle", "v2": "cgroup v2 io.max"}.get(version, "")


def cpu_limit_support() -> str:
    version = _support("cpu")
    return {"v1": "cgroup v1 cpu.cfs_quota_us", "v2": "cgroup v2 cpu.max"}.get(version, "")


class Cgroup:
    """A child cgroup of one controller ("io" or "cpu"); a context manager that removes it on exit."""

    def __init__(self, controller: str) -> None:
        self.controller = controller
        self.version = _support(controller)
        if not self.version:
            raise RuntimeError(f"no {controller} cgroup controller can be used here (root and cgroup v1 "
                               f"{'/'.join(_V1_DIRS[controller])} or v2 with {controller} are needed)")
        root = _v1_root(controller) if self.version == "v1" else _v2_root(controller)
        self.root = root
        self.path = root / f"breeze-test-{os.getpid()}-{next(_counter)}"
        self._origins: dict[int, Path] = {}

    def __enter__(self) -> Cgroup:
        if self.version == "v2":  # the root may enable any controller for its children
            subtree = self.root / "cgroup.subtree_control"
            if self.controller not in subtree.read_text().split():
                subtree.write_text(f"+{self.controller}")
        self.path.mkdir()
        return self

    def _write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def limit_io(self, device: str, read_bps: int = 0, write_bps: int = 0) -> None:
        """Bytes per second to and from `device` (0 = no limit)."""
        rdev = os.stat(device).st_rdev
        dev = f"{os.major(rdev)}:{os.minor(rdev)}"
        if self.version == "v1":
            self._write("blkio.throttle.read_bps_device", f"{dev} {read_bps}")
            self._write("blkio.throttle.write_bps_device", f"{dev} {write_bps}")
        else:
            self._write("io.max", f"{dev} rbps={read_bps or 'max'} wbps={write_bps or 'max'}")

    def limit_cpu(self, fraction: float, period_us: int = 100_000) -> None:
        """At most `fraction` of one CPU."""
        quota = max(1000, int(period_us * fraction))
        if self.version == "v1":
            self._write("cpu.cfs_period_us", str(period_us))
            self._write("cpu.cfs_quota_us", str(quota))
        else:
            self._write("cpu.max", f"{quota} {period_us}")

    def cpu_stat(self) -> dict[str, int]:
        """cpu.stat as numbers (nr_throttled, throttled_time ns in v1 / throttled_usec in v2, ...)."""
        out = {}
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, value = line.split()
            out[key] = int(value)
        return out

    def throttled_ns(self) -> int:
        stat = self.cpu_stat()
        return stat["throttled_time"] if "throttled_time" in stat else stat.get("throttled_usec", 0) * 1000

    def _origin(self, pid: int) -> Path:
        """The cgroup `pid` is in now, in this controller's hierarchy."""
        want = "blkio" if self.controller == "io" else "cpu"
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if (self.version == "v2" and hierarchy == "0") or (self.version == "v1" and want in controllers.split(",")):
                return self.root / path.lstrip("/")
        return self.root

    def add(self, pid: int) -> None:
        self._origins.setdefault(pid, self._origin(pid))
        self._write("cgroup.procs", str(pid))

    def restore(self, pid: int) -> None:
        origin = self._origins.pop(pid, self.root)
        try:
            (origin / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            pass
        except OSError as exc:
            if exc.errno != 3:  # ESRCH: the process is gone
                raise

    def __exit__(self, *exc) -> None:
        for pid in list(self._origins):
            self.restore(pid)
        try:
            self.path.rmdir()
        except OSError:  # a process still inside (it exits later); the directory goes with the next reboot
            pass


class LoopVolume:
    """An ext4 file system of `size_mb` in a temporary file, loop-mounted at `mountpoint`."""

    def __init__(self, size_mb: int = 64) -> None:
        self.size_mb = size_mb
        self._tmp = tempfile.TemporaryDirectory(prefix="breeze-loop-")
        self.image = Path(self._tmp.name) / "volume.img"
        self.mountpoint = Path(self._tmp.name) / "mnt"
        self.device = ""

    def __enter__(self) -> LoopVolume:
        try:
            with open(self.image, "wb") as f:
                f.truncate(self.size_mb * 1024 * 1024)
            _run("mkfs.ext4", "-q", "-F", str(self.image))
            self.device = _run("losetup", "-f", "--show", str(self.image))
            self.mountpoint.mkdir()
            _run("mount", self.device, str(self.mountpoint))
        except BaseException:
            self.__exit__()
            raise
        return self

    def drop_cache(self, path: str | Path) -> None:
        """Evict a (clean) file's pages, so the next read comes from the device."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def __exit__(self, *exc) -> None:
        if self.mountpoint.is_mount():
            subprocess.run(["umount", str(self.mountpoint)], capture_output=True, timeout=60)
        if self.device:
            subprocess.run(["losetup", "-d", self.device], capture_output=True, timeout=60)
            self.device = ""
        self._tmp.cleanup()


class CpuContention:
    """CPU starvation without a cgroup: the process's threads and a busy-looping child share one CPU, the
    process at nice 10 (about 10% of that CPU against the child's 90%). Restores affinity and nice."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._saved: dict[int, tuple[set[int], int]] = {}
        self._spinner: subprocess.Popen | None = None

    def _threads(self) -> list[int]:
        return [int(t) for t in os.listdir(f"/proc/{self.pid}/task")]

    def __enter__(self) -> CpuContention:
        import sys

        cpu = max(os.sched_getaffinity(self.pid))
        self._spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(self._spinner.pid, {cpu})
        for tid in self._threads():
            self._saved[tid] = (os.sched_getaffinity(tid), os.getpriority(os.PRIO_PROCESS, tid))
            os.sched_setaffinity(tid, {cpu})
            os.setpriority(os.PRIO_PROCESS, tid, 10)
        return self

    def __exit__(self, *exc) -> None:
        if self._spinner is not None:
            self._spinner.kill()
            self._spinner.wait(timeout=30)
        for tid, (cpus, nice) in self._saved.items():
            try:
                os.sched_setaffinity(tid, cpus)
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except (ProcessLookupError, PermissionError):
                pass
