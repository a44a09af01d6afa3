"""Optional `torch.compile` of the fast path's units (Inductor fuses each layer's element-wise chains).

The compiled code runs inside OUR CUDA graphs (fastpath/graph.py): Inductor is used without its own
CUDA graphs (mode "default"), compiled with `fullgraph=True, dynamic=False` during the runner's warm-up,
before capture. Choice, per process, from the environment:

- `BREEZE_FASTPATH_COMPILE`: `auto` (default: compile on CUDA when Triton is importable), `on`, `off`.
- `BREEZE_FASTPATH_COMPILE_BACKEND`: `inductor` (default); `aot_eager` traces without generating code
  (the CPU test of the tracing).
- `BREEZE_FASTPATH_FORM`: the decoder layers' form when compiled (fastpath/layers.py FORMS); `auto`
  (default): `fused+chain+all` up to FUSED_ROWS rows (one stream, with or without CFG), else BATCHED_FORM
  (`gemm+attention`, below)
  (results/NOTES.md runs 21-22, bf16, CFG on: `fused+chain+all` 9.08 / 9.21, `fused+chain+mlp` 10.39 /
  9.57 ms per frame in the same runs; run 16: `fused+chain+mlp` 10.10, `fused+chain` 10.27, `fused`
  11.77). Above 2 rows the fused kernels' per-row reductions lose to the library's GEMMs
  (results/batching/NOTES.md runs 7-8: language-model step at 2 streams, 4 rows, 13.21 ms fused vs 12.77
  gemm; at 4 streams 22.42 ms fused (8 rows) vs 12.56 gemm (6 rows); at 1 stream 8.48 fused vs 12.29 gemm).
  `gemm+mlp` (opt-in; 1.4-1.7x slower than `gemm`'s MLP at 16-48 rows on the H200, results/batching/NOTES.md
  run 12): `gemm` with the MLPs as fastpath/fused_rows.py's tensor-core kernels; if they cannot be built the
  runner falls back to `gemm`. `gemm+attention` (the default above 2 rows since results/batching/NOTES.md
  run 22: the 32-stream language-model step 13.28 -> 11.31 ms against `gemm` in one process): `gemm` with the
  depth decoder's RoPE, cache write and attention as fastpath/fused.py's kernels and the down projection's
  residual added in place in the GEMM's epilogue; the same fallback (the batched step's too,
  engine/batch_graphs.py).
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

log = logging.getLogger(__name__)

COMPILE_ENV = "BREEZE_FASTPATH_COMPILE"
BACKEND_ENV = "BREEZE_FASTPATH_COMPILE_BACKEND"
FORM_ENV = "BREEZE_FASTPATH_FORM"
TUNE_ENV = "BREEZE_FASTPATH_TUNE"
SAMPLER_ENV = "BREEZE_FASTPATH_SAMPLER"
FUSED_ROWS = 2  # up to this many model rows the `auto` form is the fused kernels' (module docstring)
BATCHED_FORM = "gemm+attention"  # the `auto` form above FUSED_ROWS (module docstring)
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


def library_gemm_form(form: str | None) -> str | None:
    """The form to retry when `form`'s Triton kernels fail to build: "gemm" (the library's GEMMs only) for the
    "gemm+..." forms, None for any other (the batch-1 runner and the batched step share this rule)."""
    return "gemm" if form is not None and form.startswith("gemm+") else None


def layer_form(rows: int) -> str:
    """The compiled decoder layers' form for a step of `rows` model rows (environment, else by rows)."""
    from breeze_worker.engine.fastpath.layers import FORMS

    form = os.environ.get(FORM_ENV, "auto").strip().lower() or "auto"
    if form == "auto":
        return "fused+chain+all" if rows <= FUSED_ROWS else BATCHED_FORM
    if form not in FORMS:
        raise ValueError(f"{FORM_ENV}={form!r}: expected auto or one of {', '.join(FORMS)}")
    return form


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
