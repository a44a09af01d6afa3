"""The GPU correctness suite: every test marked `gpu` needs a CUDA device and is skipped without one.

Run it on a GPU host in one call: `python -m pytest -m gpu tests/gpu` (benchmarks/device_run.py's
`gpu-tests` step does, and collects the figures the tests write). The CPU suite collects these modules and
skips them with the reason; the tests here that carry no `gpu` mark run the same checks' logic on the CPU
(tiny models, the kernels' torch stages), so that a bug in a check shows up before any device time is spent.

This suite runs on the GPU hosts' own Python (torch 2.11, Triton 3.6, no zstandard, soundfile, soxr or
librosa, no pytest-asyncio), so nothing here imports those, nor gRPC.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """Each failure's traceback to $BREEZE_GPU_FIGURES/failures.jsonl as it happens: a run its host's time
    limit ends writes no JUnit file, and its failures would otherwise be only the progress line's Fs."""
    directory = os.environ.get("BREEZE_GPU_FIGURES")
    if not directory or not report.failed:
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    with open(Path(directory) / "failures.jsonl", "a") as out:
        out.write(json.dumps({"test": report.nodeid, "when": report.when,
                              "traceback": str(report.longrepr)[-6000:]}) + "\n")


@pytest.fixture(scope="session")
def cuda() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture
def write_figures():
    """`write_figures(name, doc)`: see gpu_support.write_figures."""
    from gpu_support import write_figures

    return write_figures
