"""Peak memory, per measured section: GPU allocated and reserved (the caching allocator's pool, what
`nvidia-smi` sees), and the host's resident set.

The host peak is per section on Linux: writing 5 to /proc/self/clear_refs resets the kernel's high-water
mark (VmHWM), which /proc/self/status then reports. Elsewhere (or when the reset is not allowed) it is the
process's lifetime peak (`getrusage` ru_maxrss), and `host_peak_scope` says which.
"""

from __future__ import annotations

import logging
import resource
import sys
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def reset_host_peak() -> str:
    """Reset the host high-water mark if the OS allows it; returns the scope of the next reading."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return "section"
    except OSError:
        return "process"


def host_peak_rss_bytes() -> int:
    """Peak resident set since `reset_host_peak` (Linux) or since the process started."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def reset_gpu_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def gpu_peaks(device: torch.device) -> dict:
    """Peak allocated and reserved bytes since `reset_gpu_peaks` (None on the CPU)."""
    if device.type != "cuda":
        return {"gpu_peak_allocated_bytes": None, "gpu_peak_reserved_bytes": None}
    return {"gpu_peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "gpu_peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device))}


class PeakMemory:
    """`with PeakMemory(device) as peaks: ...` then `peaks.result` (a dict of the figures above)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.result: dict = {}
        self._scope = "process"

    def __enter__(self) -> PeakMemory:
        reset_gpu_peaks(self.device)
        self._scope = reset_host_peak()
        return self

    def __exit__(self, *exc) -> None:
        self.result = {**gpu_peaks(self.device), "host_peak_rss_bytes": host_peak_rss_bytes(),
                       "host_peak_scope": self._scope}
