"""Peak memory per measured section (measure/memory.py), as `breeze-worker bench` reports it.

The sections are measured in a fresh interpreter: in the test process, whatever earlier tests left mapped (a
worker, a model, memory the allocator kept) decides whether a new allocation raises the resident set at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SECTIONS = r"""
import json

import torch

from breeze_worker.measure.memory import PeakMemory

with PeakMemory(torch.device("cpu")) as baseline:
    pass
with PeakMemory(torch.device("cpu")) as peaks:
    block = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
    assert float(block[-1]) == 1.0
    del block
print(json.dumps({"baseline": baseline.result, "peaks": peaks.result}))
"""


def test_host_peak_sees_a_large_allocation_and_gpu_peaks_are_none_on_the_cpu():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "worker"))
    done = subprocess.run([sys.executable, "-c", SECTIONS], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    baseline, peaks = result["baseline"], result["peaks"]
    assert peaks["gpu_peak_allocated_bytes"] is None and peaks["gpu_peak_reserved_bytes"] is None
    if sys.platform.startswith("linux"):  # CI: the high-water mark is reset per section
        assert peaks["host_peak_scope"] == "section"
        assert peaks["host_peak_rss_bytes"] >= baseline["host_peak_rss_bytes"] + 60 * 2**20
    else:
        assert peaks["host_peak_scope"] == "process"
        assert peaks["host_peak_rss_bytes"] >= 64 * 2**20
