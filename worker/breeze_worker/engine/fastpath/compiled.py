"""Optional `torch.compile` of the fast path's units (Inductor fuses each layer's element-wise chains).

The compiled code runs inside OUR CUDA graphs (fastpath/graph.py): Inductor is used without its own
CUDA graphs (mode "default"), compiled with `fullgraph=True, dynamic=False` during the runner's warm-up,
before capture. Choice, per process, from the environment:

- `BREEZE_FASTPATH_COMPILE`: `auto` (default: compile on CUDA when Triton is importable), `on`, `off`.
- `BREEZE_FASTPATH_COMPILE_BACKEND`: `inductor` (default); `aot_eager` traces without generating code
  (the CPU test of the tracing).
- `BREEZE_FASTPATH_FORM`: the decoder layers' form when compiled (fastpath/forms.py FORMS); `auto`
  (default): `fused+chain+all` up to FUSED_ROWS rows (one stream, with or without CFG), else `gemm+attention`
  (fastpath/forms.py `select_form`). If a form's Triton kernels cannot be built, its fallback is compiled
  instead (`fused+chain+all` -> `units+attn`, `gemm+attention` -> `gemm`).
- `BREEZE_FASTPATH_TUNE`: `on` lets Inductor's coordinate-descent tuning pick the block sizes of the
  reduction kernels; `off` (default) skips it. On the H200 (results/NOTES.md runs 16-17, two device
  sessions): 10.10 -> 9.74 ms per frame (fused+chain+mlp, bf16, CFG on) for ~50 s more compilation per
  batch shape. Off by default
  because the choice is made by timing: another process may pick other block sizes, so another
  summation order, and a seed's audio could change across a restart (rarely: a rounding-level change
  must flip a sampled token). Inductor caches its choices on disk (TORCHINDUCTOR_CACHE_DIR): a worker
  that keeps that directory across restarts keeps them.

- `BREEZE_FASTPATH_SAMPLER`: who draws each position's codes: `auto` (default: the Triton sampling
  kernel, fastpath/fused_sampling.py, wherever the fused kernels run: CUDA with Triton), `kernel`, or
  `torch` (engine/sampling.py compiled with the units).

Any failure to compile is the caller's to catch: the runner logs it and serves the uncompiled step.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable

import torch

from breeze_worker.engine.fastpath.forms import FORMS, LayerForm, select_form

log = logging.getLogger(__name__)

COMPILE_ENV = "BREEZE_FASTPATH_COMPILE"
BACKEND_ENV = "BREEZE_FASTPATH_COMPILE_BACKEND"
FORM_ENV = "BREEZE_FASTPATH_FORM"
TUNE_ENV = "BREEZE_FASTPATH_TUNE"
SAMPLER_ENV = "BREEZE_FASTPATH_SAMPLER"
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


def layer_form(rows: int) -> LayerForm:
    """The compiled decoder layers' form for a step of `rows` model rows (environment, else by rows)."""
    form = os.environ.get(FORM_ENV, "auto").strip().lower() or "auto"
    try:
        return select_form(rows, compiled=True, requested=form)
    except ValueError:
        raise ValueError(f"{FORM_ENV}={form!r}: expected auto or one of {', '.join(FORMS)}") from None


def sampling_kernel_wanted(device: torch.device) -> bool:
    """Whether the sampling kernel draws the codes on `device` (environment; `auto`: where it can run, on CUDA)."""
    from breeze_worker.engine.fastpath import fused_sampling

    mode = os.environ.get(SAMPLER_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "kernel", "torch"):
        raise ValueError(f"{SAMPLER_ENV}={mode!r}: expected auto, kernel or torch")
    if mode == "torch":
        return False
    if mode == "kernel":
        if not fused_sampling.available(device):
            raise ValueError(f"{SAMPLER_ENV}=kernel: the sampling kernel needs Triton and a CUDA device "
                             f"(or TRITON_INTERPRET=1), not {device}")
        return True
    return device.type == "cuda" and fused_sampling.available(device)


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
    tune = os.environ.get(TUNE_ENV, "off").strip().lower() in ("1", "on", "true", "yes")
    key = (fn, backend(), tune)
    if key in _compiled:
        return _compiled[key]
    _raise_limits()
    name = backend()
    options = {"fullgraph": True, "dynamic": False, "backend": name}
    if name == "inductor":  # Inductor's own CUDA graphs stay off: ours capture the compiled code
        if tune:  # torch.compile takes `mode` or `options`, not both; "default" mode is these options' base
            options["options"] = {"coordinate_descent_tuning": True}
        else:
            options["mode"] = "default"
    compiled = _compiled[key] = torch.compile(fn, **options)
    return compiled
