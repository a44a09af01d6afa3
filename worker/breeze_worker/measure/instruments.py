"""Measuring instruments for the engine benchmark: clocks, host-sync counting, GPU-busy fraction, memory,
copy bandwidth. Each works on the CPU too (returning what it can), so the bench runs in tests.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Iterator

import torch

log = logging.getLogger(__name__)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    """A host clock read after the device's queued work has finished (perf_counter seconds)."""
    synchronize(device)
    return time.perf_counter()


@contextlib.contextmanager
def explicit_waits() -> Iterator[dict]:
    """Count the explicit waits for the device (`torch.cuda.synchronize`, `Stream.synchronize`,
    `Event.synchronize`: measure/syncaudit.py `watch_waits`) made inside the block on this thread, into the
    yielded dict's "n": CUDA's sync debug mode warns only on the ATen operators that synchronize."""
    from breeze_worker.measure.syncaudit import watch_waits

    waits = {"n": 0}

    def count(op: str) -> None:
        waits["n"] += 1

    with watch_waits(count):
        yield waits


class SyncCounter:
    """Counts device-to-host synchronizations (`.item()`, `.cpu()`, `.tolist()`, nonzero, multinomial, explicit
    waits, ...) per named section of the code (`with counter.section("lm"): ...`) while `counting()` is open.

    On CUDA: PyTorch's CUDA sync debug mode, which warns on every synchronizing ATen call (the ground truth),
    plus the explicit waits it does not see (`explicit_waits`: the fast path's per-frame read waits on an event).
    On the CPU: measure/syncaudit.py's `SyncDetector`, which emulates a device (it counts what would synchronize
    on a GPU; it slows every tensor operation down, so count in a run that is not timed). `on_sync(event)`
    (e.g. a trace mark) is called for every sync the detector sees; on CUDA a detector runs for it alongside
    the debug mode, which alone is counted."""

    def __init__(self, device: torch.device, on_sync: Callable | None = None):
        self.device = device
        self.on_sync = on_sync
        self.counts: dict[str, int] = {}
        self.source = ("cuda sync debug mode + explicit waits" if device.type == "cuda"
                       else "emulated (measure/syncaudit.py)")
        self._total: Callable[[], int] | None = None

    @property
    def count(self) -> int | None:
        """Syncs counted in every section (None before anything was counted)."""
        return sum(self.counts.values()) if self.counts else None

    @contextlib.contextmanager
    def counting(self) -> Iterator[SyncCounter]:
        from breeze_worker.measure.syncaudit import SyncDetector

        if self.device.type != "cuda":
            with SyncDetector(self.device, on_sync=self.on_sync) as detector:
                self._total = lambda: len(detector.events)
                try:
                    yield self
                finally:
                    self._total = None
            return
        marks = SyncDetector(self.device, on_sync=self.on_sync) if self.on_sync else contextlib.nullcontext()
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught, marks, explicit_waits() as waits:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            self._total = lambda: sum(1 for w in caught if "synchroniz" in str(w.message)) + waits["n"]
            try:
                yield self
            finally:
                self._total = None
                torch.cuda.set_sync_debug_mode(previous)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Syncs inside the block are added to `counts[name]` (nothing is counted outside `counting()`)."""
        if self._total is None:
            yield
            return
        before = self._total()
        try:
            yield
        finally:
            self.counts[name] = self.counts.get(name, 0) + self._total() - before


def gpu_busy_fraction(device: torch.device, work: Callable[[], object]) -> dict:
    """Run `work()` under torch.profiler; return kernel time, wall time and their ratio.

    Near 1: the GPU is kept busy, kernels and dtypes are what to improve. Small: host overhead (launches,
    syncs, Python) is. Kernels replayed from CUDA graphs are counted too. None on the CPU.
    """
    if device.type != "cuda":
        return {"kernel_s": None, "wall_s": None, "busy_fraction": None, "kernels": None, "top_kernels": []}
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        work()
        synchronize(device)
        wall = time.perf_counter() - t0
    kernel_us = 0.0
    intervals = []
    by_name: dict[str, list[float]] = {}
    try:
        for event in prof.profiler.kineto_results.events():
            if event.device_type() == torch.autograd.DeviceType.CUDA:
                start = event.start_ns() if hasattr(event, "start_ns") else event.start_us() * 1000
                intervals.append((start, start + event.duration_ns()))
                entry = by_name.setdefault(event.name()[:80], [0, 0.0])
                entry[0] += 1
                entry[1] += event.duration_ns() / 1000.0
    except Exception as exc:  # profiler internals differ between releases: fall back to averages
        log.debug("kineto events unavailable (%s); using key averages", exc)
        intervals = []
        kernel_us = sum(getattr(e, "self_device_time_total", 0.0) for e in prof.key_averages())
    if intervals:  # merge overlaps so concurrent kernels are not counted twice
        intervals.sort()
        busy_ns, cur_start, cur_end = 0, intervals[0][0], intervals[0][1]
        for start, end in intervals[1:]:
            if start > cur_end:
                busy_ns += cur_end - cur_start
                cur_start, cur_end = start, end
            else:
                cur_end = max(cur_end, end)
        busy_ns += cur_end - cur_start
        kernel_us = busy_ns / 1000.0
    kernel_s = kernel_us / 1e6
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:30]
    return {"kernel_s": kernel_s, "wall_s": wall, "busy_fraction": kernel_s / wall if wall > 0 else None,
            "kernels": len(intervals),
            "top_kernels": [{"name": n, "count": c, "total_us": round(us, 1)} for n, (c, us) in top]}


def copy_bandwidth(device: torch.device, megabytes: int = 1024, repeats: int = 10) -> float | None:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written (None on the CPU)."""
    if device.type != "cuda":
        return None
    n = megabytes * 1024 * 1024 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1000.0 / repeats
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 4 / seconds


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int | None:
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def software_versions(device: torch.device) -> dict:
    """What a result ran with: torch, Triton, CUDA's runtime and the driver (nvidia-smi; None off CUDA or
    without it)."""
    import importlib.util
    import subprocess

    triton = None
    if importlib.util.find_spec("triton") is not None:
        import triton as triton_module

        triton = triton_module.__version__
    driver = None
    if device.type == "cuda":
        try:
            index = device.index if device.index is not None else torch.cuda.current_device()
            done = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=driver_version",
                                   "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            driver = (done.stdout.strip() or None) if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            driver = None
    return {"torch": torch.__version__, "triton": triton, "cuda": torch.version.cuda, "driver": driver}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"
