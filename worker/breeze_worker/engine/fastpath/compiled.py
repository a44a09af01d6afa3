"""Optional `torch.compile` of the fast path's units (Inductor fuses each layer's element-wise chains).

The compiled code runs inside OUR CUDA graphs (fastpath/graph.py): Inductor is used without its own
CUDA graphs (mode "default"), compiled with `fullgraph=True, dynamic=False` during the runner's warm-up,
before capture. What is compiled and how follows the step's `FastPathSettings` (breeze_worker/config.py):

- `compile`: `auto` (compile on CUDA when Triton is importable), `on`, `off` (`compile_wanted`).
- `compile_backend`: `inductor`; `aot_eager` traces without generating code (the CPU tests of the tracing).
- `form`: the compiled layers' form (fastpath/forms.py `select_form`; `auto`: by the step's row count). If a
  form's Triton kernels cannot be built, its fallback is compiled instead.
- `tune`: Inductor's coordinate-descent tuning picks the block sizes of its reduction kernels. Off by default
  because the choice is made by timing: another process may pick other block sizes, so another summation
  order, and a seed's audio could change across a restart (rarely: a rounding-level change must flip a
  sampled token). Inductor caches its choices on disk (TORCHINDUCTOR_CACHE_DIR): a worker that keeps that
  directory across restarts keeps them.
- `sampler`: who draws each position's codes: `auto` (the Triton sampling kernel, fastpath/fused_sampling.py,
  wherever it runs: CUDA with Triton), `kernel`, or `torch` (engine/sampling.py compiled with the units)
  (`sampling_kernel_wanted`).

Any failure to compile is the caller's to catch: the runner logs it and serves the uncompiled step.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from breeze_worker.config import FastPathSettings

log = logging.getLogger(__name__)

RECOMPILE_LIMIT = 128  # one entry per (unit, shape, dtype, runner): a bench run has a few dozen
_compiled: dict[tuple, Callable] = {}


def compile_wanted(device: torch.device, settings: FastPathSettings) -> bool:
    """Whether to compile the step's units on `device` (`auto`: on CUDA with Triton importable)."""
    if settings.compile != "auto":
        return settings.compile == "on"
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


def sampling_kernel_wanted(device: torch.device, settings: FastPathSettings) -> bool:
    """Whether the sampling kernel draws the codes on `device` (`auto`: where it can run, on CUDA); `kernel`
    where it cannot run is refused with a ValueError."""
    from breeze_worker.engine.fastpath import fused_sampling

    if settings.sampler == "torch":
        return False
    available = fused_sampling.available(device, settings.kernels)
    if settings.sampler == "kernel":
        if not available:
            raise ValueError(f"fast-path sampler kernel (BREEZE_FASTPATH_SAMPLER=kernel): the sampling kernel needs "
                             f"Triton and a CUDA device (or TRITON_INTERPRET=1), not {device}")
        return True
    return device.type == "cuda" and available


def _raise_limits() -> None:
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < RECOMPILE_LIMIT:
            setattr(config, name, RECOMPILE_LIMIT)
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)


def compile_unit(fn: Callable, settings: FastPathSettings) -> Callable:
    """`torch.compile(fn)` for the fast path: whole graph, static shapes (or automatic dynamic ones with the
    `dynamic_shapes` setting), no CUDA graphs of its own, with the settings' backend and tuning.

    Compiled once per process, function, backend and tuning (the compiled form is shared; Dynamo guards add an
    entry per new shape, dtype or step object)."""
    name, tune, dynamic = settings.compile_backend, settings.tune, settings.dynamic_shapes
    key = (fn, name, tune, dynamic)
    _raise_limits()  # Dynamo keeps its limits per thread: the thread binding the units compiles them
    if key in _compiled:
        return _compiled[key]
    mode: str | None = None
    options: dict[str, str | int | bool | Callable] | None = None
    if name == "inductor":  # Inductor's own CUDA graphs stay off: ours capture the compiled code
        if tune:  # torch.compile takes `mode` or `options`, not both; "default" mode is these options' base
            options = {"coordinate_descent_tuning": True}
        else:
            mode = "default"
    # dynamic_shapes: None is Dynamo's automatic mode (static for the first shape, symbolic sizes from the
    # first shape that differs), so the batch-1 shape keeps its static kernels
    compiled = _compiled[key] = torch.compile(fn, fullgraph=True, dynamic=None if dynamic else False, backend=name,
                                              mode=mode, options=options)
    return compiled
