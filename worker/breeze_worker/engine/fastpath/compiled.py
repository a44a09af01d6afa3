"""Optional `torch.compile` of the fast path's units (Inductor fuses each layer's element-wise chains).

The compiled code runs inside OUR CUDA graphs (fastpath/graph.py): Inductor is used without its own
CUDA graphs (mode "default"), compiled with `fullgraph=True, dynamic=False` during the runner's warm-up,
before capture. Choice, per process, from the environment:

- `BREEZE_FASTPATH_COMPILE`: `auto` (default: compile on CUDA when Triton is importable), `on`, `off`.
- `BREEZE_FASTPATH_COMPILE_BACKEND`: `inductor` (default); `aot_eager` traces without generating code
  (the CPU test of the tracing).

Any failure to compile is the caller's to catch: the runner logs it and serves the uncompiled step.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

COMPILE_ENV = "BREEZE_FASTPATH_COMPILE"
BACKEND_ENV = "BREEZE_FASTPATH_COMPILE_BACKEND"
RECOMPILE_LIMIT = 128  # one entry per (unit, shape, dtype, runner): a bench run has a few dozen
_compiled: dict[tuple, Callable] = {}


def compile_wanted(device: torch.device, requested: bool | None = None) -> bool:
    """Whether to compile on `device`: `requested` if given, else the environment (`auto`: CUDA + Triton)."""
    if requested is not None:
        return requested
    mode = os.environ.get(COMPILE_ENV, "auto").strip().lower()
    if mode in ("0", "off", "false", "no"):
        return False
    if mode in ("1", "on", "true", "yes"):
        return True
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


def backend() -> str:
    return os.environ.get(BACKEND_ENV, "inductor").strip() or "inductor"


def _raise_limits() -> None:
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < RECOMPILE_LIMIT:
            setattr(config, name, RECOMPILE_LIMIT)
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)


def compile_unit(fn: Callable) -> Callable:
    """`torch.compile(fn)` for the fast path: whole graph, static shapes, no CUDA graphs of its own.

    Compiled once per process and function (the compiled form is shared; Dynamo guards add an entry per
    new shape, dtype or step object)."""
    key = (fn, backend())
    if key in _compiled:
        return _compiled[key]
    _raise_limits()
    name = backend()
    options = {"fullgraph": True, "dynamic": False, "backend": name}
    if name == "inductor":
        options["mode"] = "default"
    compiled = _compiled[key] = torch.compile(fn, **options)
    return compiled
