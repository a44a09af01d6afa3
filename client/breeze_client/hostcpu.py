"""How much CPU the calling thread got: its run time and its wait for a CPU (Linux schedstat).

`/proc/thread-self/schedstat` holds three numbers for the thread: nanoseconds it ran, nanoseconds it
waited runnable on a run queue (a CPU-starved or cgroup-throttled thread waits here), and the number of
time slices. A retrieval samples it before and after a call made on one thread; the difference is the
evidence for a client starved of CPU. Elsewhere (no /proc) the sample is None and the evidence unknown.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

_PATH = "/proc/thread-self/schedstat"


@dataclass(frozen=True)
class CpuSample:
    run_ns: int  # time on a CPU so far
    wait_ns: int  # time runnable but waiting for a CPU so far
    tid: int = 0  # the thread they belong to (samples of two threads do not subtract)


def sample() -> CpuSample | None:
    """The calling thread's CPU counters now (None where the kernel does not expose them)."""
    try:
        with open(_PATH, encoding="ascii") as f:
            run, wait, *_ = f.read().split()
        return CpuSample(int(run), int(wait), threading.get_native_id())
    except (OSError, ValueError):
        return None


def wait_between(start: CpuSample | None, end: CpuSample | None) -> int | None:
    """The thread's wait for a CPU from `start` to `end` (None unless both are samples of one thread)."""
    if start is None or end is None or start.tid != end.tid:
        return None
    return end.wait_ns - start.wait_ns


def since(start: CpuSample | None) -> tuple[int | None, int | None]:
    """(run ns, wait ns) of the calling thread since `start` (None, None if either sample is missing)."""
    end = sample()
    if start is None or end is None:
        return None, None
    return end.run_ns - start.run_ns, end.wait_ns - start.wait_ns
