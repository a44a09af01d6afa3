"""The worker's own CPU evidence: how long its threads waited for a CPU while they served a request.

Linux keeps three counters per thread in `/proc/thread-self/schedstat` (another thread of this process:
`/proc/self/task/<tid>/schedstat`): nanoseconds on a CPU, nanoseconds runnable but waiting on a run queue,
and time slices. A thread that a busy host or a cgroup CPU quota holds back waits there, and nowhere else:
a commit whose fsync "took" two seconds may have spent them waiting to run after the disk was done. The
worker samples the counters around what it does for a request (the commit, the open, each chunk's read, the
Fetch handler, the final message) and sends the differences with its other evidence, so a client tells a
starved worker from a slow volume or path. The counter grows when the waiting thread gets its CPU, so a
sample taken when a thread starts a task already holds the wait for that start; `PoolTask` adds it back
for threads that sleep between tasks (the artifact I/O and read threads).

Where the kernel does not expose the counters (not Linux, or a kernel built without schedstats) every
sample is None, and the messages leave their CPU fields unset: the client then says it does not know.

A thread that is not runnable does not wait: while gRPC's own threads read a request off the socket or send
a response, the event loop thread may sleep, and a thread waiting for the interpreter lock that a throttled
thread holds sleeps too; a CPU quota that stops the whole process then shows on no thread the worker
samples. So the worker also reads how long its cgroup's CPU quota held all its threads (`Held`: `cpu.stat`'s
throttled time, of its own cgroup and each ancestor with a limit) over the same spans, and reports the
longer of the two waits.

`finals` keeps, per artifact, what was sampled when its job's final message was handed to gRPC, so the
artifact's first Fetch can say how long the worker was held between the two: the time a request spends
reaching a starved worker's handler.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

_SELF = "/proc/thread-self/schedstat"
FINALS_KEPT = 1024  # final-message samples kept for artifacts not yet fetched (the oldest go first)


@dataclass(frozen=True)
class CpuSample:
    run_ns: int  # time on a CPU so far
    wait_ns: int  # time runnable but waiting for a CPU so far
    tid: int  # the thread the counters belong to

    def wait_since(self, earlier: CpuSample | None) -> int | None:
        """Nanoseconds this thread waited for a CPU since `earlier` (None when unknown or another thread's)."""
        if earlier is None or earlier.tid != self.tid:
            return None
        return max(0, self.wait_ns - earlier.wait_ns)

    def run_since(self, earlier: CpuSample | None) -> int | None:
        if earlier is None or earlier.tid != self.tid:
            return None
        return max(0, self.run_ns - earlier.run_ns)


def _read(path: str) -> str | None:
    """A /proc or cgroup file's text, None when it cannot be read (a thread gone, a cgroup removed). Plain
    system calls, no file object: a sample sits in the serving path. Nothing is kept open: the worker's
    descriptors stay its own count."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def sample(tid: int | None = None) -> CpuSample | None:
    """The counters of the calling thread, or of thread `tid` of this process; None where there are none."""
    own = tid is None
    tid = threading.get_native_id() if tid is None else tid
    text = _read(_SELF if own else f"/proc/self/task/{tid}/schedstat")
    try:
        run, wait, *_ = (text or "").split()
        return CpuSample(int(run), int(wait), tid)
    except ValueError:
        return None


def waited(start: CpuSample | None) -> int | None:
    """The calling thread's wait for a CPU since `start` (taken on this thread)."""
    end = sample() if start is not None else None
    return None if end is None else end.wait_since(start)


_idle = threading.local()  # a pool thread's counters when it finished its previous task


class PoolTask:
    """The wait for a CPU of one task on a pool thread (`with PoolTask() as task: ...; task.wait_ns`): from the
    end of the thread's previous task, when it went idle (an idle thread sleeps, it does not wait), through the
    end of this one, so the wait to be woken for this task counts (a thread's first task counts from the
    thread's start); with `quota`, or how long the CPU quota held every thread during the task when that is
    longer (for tasks no wider span samples: a chunk's read sits inside its Fetch handler's, which does)."""

    def __init__(self, quota: bool = True) -> None:
        self.wait_ns: int | None = None
        self.run_ns: int | None = None
        self._quota = quota
        self._start: CpuSample | None = None
        self._held: Held | None = None
        self.ended: Held | None = None  # what was sampled as the task ended (with the quota's, with `quota`)

    def __enter__(self) -> PoolTask:
        self._held = held() if self._quota else Held(sample(), {})
        now, before = self._held.thread, getattr(_idle, "sample", None)
        self._start = before if before is not None and now is not None and before.tid == now.tid else now
        return self

    def __exit__(self, *exc) -> None:
        end = held() if self._quota else Held(sample(), {})
        thread = None if end.thread is None else end.thread.wait_since(self._start)
        quota = end.quota_since(self._held) if self._held is not None else None
        if thread is not None or quota is not None:
            self.wait_ns = max(thread or 0, quota or 0)
        self.run_ns = None if end.thread is None else end.thread.run_since(self._start)
        self.ended = end
        _idle.sample = end.thread


def _cgroup_mounts() -> tuple[str | None, tuple[str, str] | None]:
    """(the cgroup v2 mount point, (v1 cpu controller's mount point, its root)) from /proc/self/mountinfo."""
    v2, v1 = None, None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, kind = left.split(), right.split()
                if len(fields) < 5 or len(kind) < 3:
                    continue
                if kind[0] == "cgroup2" and v2 is None:
                    v2 = fields[4]
                elif kind[0] == "cgroup" and "cpu" in kind[2].split(","):
                    v1 = (fields[4], fields[3])
    except OSError:
        pass
    return v2, v1


_MOUNTS = _cgroup_mounts()


CGROUP_REREAD_NS = 1_000_000_000  # how often /proc/self/cgroup is read again (a process may be moved)
_cgroup_lock = threading.Lock()
_cgroup_read: list = [None, ()]  # (monotonic ns of the last read, the cpu.stat files it named)


def _quota_stats() -> tuple[str, ...]:
    """The cpu.stat files of this process's CPU cgroup and its ancestors, as /proc/self/cgroup named them at
    most CGROUP_REREAD_NS ago (it may be moved while it runs; a span a move falls in has no common file)."""
    now = time.monotonic_ns()
    with _cgroup_lock:
        at, stats = _cgroup_read
        if at is not None and now - at < CGROUP_REREAD_NS:
            return stats
    text = _read("/proc/self/cgroup")
    stats = () if text is None else _stats_of(text)
    with _cgroup_lock:
        _cgroup_read[:] = [now, stats]
    return stats


@functools.lru_cache(maxsize=8)
def _stats_of(cgroups: str) -> tuple[str, ...]:
    """The cpu.stat files named by /proc/self/cgroup's text `cgroups`, the process's own first."""
    v2, v1 = _MOUNTS
    for line in cgroups.splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if v1 is not None and "cpu" in controllers.split(","):
            base, root = v1
            path = path[len(root):] if root != "/" and path.startswith(root) else path
        elif v1 is None and v2 is not None and hierarchy == "0":
            base = v2
        else:
            continue
        parts = [p for p in path.split("/") if p]
        return tuple("/".join([base, *parts[:n], "cpu.stat"]) for n in range(len(parts), 0, -1))
    return ()


def throttled() -> dict[str, int]:
    """cpu.stat path -> time its CPU quota held the cgroup's threads so far (ns)."""
    out = {}
    for path in _quota_stats():
        text = _read(path)
        for line in (text or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_time" and value.isdigit():  # v1, ns
                out[path] = int(value)
            elif key == "throttled_usec" and value.isdigit():  # v2
                out[path] = int(value) * 1000
    return out


@dataclass(frozen=True)
class Held:
    """The calling thread's counters and the worker's CPU-quota throttling, sampled together."""

    thread: CpuSample | None
    throttled: dict[str, int]  # cpu.stat path -> throttled ns so far
    at_ns: int = field(default_factory=time.monotonic_ns)  # when `throttled` was read

    def quota_since(self, earlier: Held) -> int | None:
        """How long the CPU quota held the worker's threads since `earlier` (None without a common cgroup). The
        kernel adds up each CPU's throttled time, so it is capped at the time that went by."""
        wall = max(0, self.at_ns - earlier.at_ns)
        quota = [min(v - earlier.throttled[k], wall) for k, v in self.throttled.items() if k in earlier.throttled]
        return max(quota) if quota else None

    def wait_since(self, earlier: Held | None) -> int | None:
        """The longer of this thread's wait for a CPU and the time the worker's CPU quota held all its threads,
        since `earlier` (None when neither is known)."""
        if earlier is None:
            return None
        thread = None if self.thread is None else self.thread.wait_since(earlier.thread)
        quota = self.quota_since(earlier)
        if thread is None and quota is None:
            return None
        return max(thread or 0, quota or 0)


def held(tid: int | None = None) -> Held:
    """The counters of the calling thread (or thread `tid` of this process) and the CPU quota's throttling."""
    return Held(sample(tid), throttled())


class _Finals:
    """artifact id -> what `held` read as its job's final message was handed to gRPC."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: OrderedDict[str, Held] = OrderedDict()

    def record(self, artifact_id: str, s: Held) -> None:
        with self._lock:
            self._samples[artifact_id] = s
            while len(self._samples) > FINALS_KEPT:
                self._samples.popitem(last=False)

    def wait_since(self, artifact_id: str, now: Held) -> int | None:
        """How long the worker was held from the artifact's final message to `now`; once per artifact."""
        with self._lock:
            then = self._samples.pop(artifact_id, None)
        return now.wait_since(then)


finals = _Finals()
