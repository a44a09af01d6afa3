"""Peak memory per measured section (profiling/memory.py), as `breeze-worker bench` reports it."""

from __future__ import annotations

import sys

import torch

from breeze_worker.profiling.memory import PeakMemory


def test_host_peak_sees_a_large_allocation_and_gpu_peaks_are_none_on_the_cpu():
    with PeakMemory(torch.device("cpu")) as baseline:
        pass
    with PeakMemory(torch.device("cpu")) as peaks:
        block = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
        assert float(block[-1]) == 1.0
        del block
    assert peaks.result["gpu_peak_allocated_bytes"] is None and peaks.result["gpu_peak_reserved_bytes"] is None
    if sys.platform.startswith("linux"):  # CI: the high-water mark is reset per section
        assert peaks.result["host_peak_scope"] == "section"
        assert peaks.result["host_peak_rss_bytes"] >= baseline.result["host_peak_rss_bytes"] + 60 * 2**20
    else:
        assert peaks.result["host_peak_scope"] == "process"
        assert peaks.result["host_peak_rss_bytes"] >= 64 * 2**20
