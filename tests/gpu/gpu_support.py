"""Helpers shared by the GPU suite's modules (tests/gpu): figures out, memory freed."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import torch

FIGURES_ENV = "BREEZE_GPU_FIGURES"  # a directory: the tests that measure something write <name>.json there


def write_figures(name: str, doc: dict) -> None:
    """`doc` as JSON to $BREEZE_GPU_FIGURES/<name>.json when that variable names a directory (the device
    runner sets it and collects the files), and to the test's output either way."""
    text = json.dumps(doc, indent=1, sort_keys=True, default=str)
    print(f"figures {name}: {text}")
    directory = os.environ.get(FIGURES_ENV)
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{name}.json").write_text(text)


def release_device_memory() -> None:
    """Drop pooled runners (they hold their model) and return cached blocks to the device."""
    from breeze_worker.engine.fastpath.graph import clear_runners

    clear_runners()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()



def fp32_mid_model(device: torch.device, capacity: int):
    """The suite's mid-size model (full widths, few layers; seeded random weights) in FP32 with `capacity`
    backbone slots and end of speech masked, for a module-scoped fixture (it yields the model, then frees it)."""
    from dataclasses import replace

    from breeze_worker.engine.precision import make_policy
    from breeze_worker.measure.models import random_model
    from breeze_worker.measure.runner import mask_end_of_speech

    model = random_model("mid", 1234, device, make_policy("fp32", "GPU suite"), with_codec=False)
    model.generation_defaults = replace(model.generation_defaults, max_sequence=capacity)
    mask_end_of_speech(model)
    yield model
    del model
    release_device_memory()
