"""CUDA graphs for the batched frame step: one per batch-shape bucket, built once at start-up.

A shape is (streams, rows): the prefix of stream slots and model rows a step covers (`FrameStep.narrow`
gives a view of the one static cache with that prefix). `sample_frame` is captured per shape; the backbone
step per (rows, attention bucket). All graphs share one memory pool: their only live outputs are the
step's static buffers, so replaying them in any order is safe.

With compilation on (fastpath/compiled.py) every bucket view runs `torch.compile`d units (each view picks
its layers' form by its row count), compiled by one warm-up pass before capture; Dynamo compiles once per
distinct shape, so the buckets are few (engine/batching.py `bucket_shapes`). The fallbacks are the batch-1
runner's (fastpath/graph.py): a compile error first retries every view whose form has a fallback in that
form (fastpath/forms.py: `gemm+attention` -> `gemm`, the library's GEMMs only; `fused+chain+all` ->
`units+attn`); another compile error is logged and the uncompiled views are captured; a capture error of
the compiled views retries them uncompiled; a second capture error leaves the views eager.

Capture runs the step on the real buffers (warm-up runs, then capture), so it happens before any stream
joins; the caller resets the rows afterwards. On the CPU the same views run eagerly (compiled if asked).
Shapes outside the buckets (the CPU's exact prefixes) get uncompiled views on first use: compiling a new
shape while streams wait would stall them.
"""

from __future__ import annotations

import logging
import time

import torch

from breeze_worker.engine.fastpath.compiled import compile_unit
from breeze_worker.engine.fastpath.forms import LayerForm, fallback_of, select_form
from breeze_worker.engine.fastpath.graph import run_on_side_stream
from breeze_worker.engine.fastpath.static_cache import buckets_up_to
from breeze_worker.engine.fastpath.step import FrameStep

log = logging.getLogger(__name__)


class ShapeGraphs:
    def __init__(self, step: FrameStep, shapes: list[tuple[int, int]], use_graphs: bool, compile: bool = False):
        self.step = step
        self.shapes = sorted(set(shapes))
        self.views = {shape: step.narrow(shape[1], shape[0]) for shape in self.shapes}
        self._extra: dict[tuple[int, int], FrameStep] = {}  # uncompiled views of non-bucket shapes
        # the backbone step reads per-stream buffers only through row -> stream gathers: capture it on the
        # widest stream prefix paired with each row count, so any paired shape's indices stay in bounds
        self._backbone_view: dict[int, FrameStep] = {}
        for s, r in self.shapes:
            if r not in self._backbone_view or self._backbone_view[r].streams < s:
                self._backbone_view[r] = self.views[(s, r)]
        self.buckets = buckets_up_to(step.cache.capacity)
        self.sample_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.backbone_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.fallback_reason: str | None = None
        self.compile_fallback_reason: str | None = None
        self.compile_requested = bool(compile and self.views)
        self.compile_s = 0.0
        self.capture_s = 0.0
        self._host: torch.Tensor | None = None  # pinned host copy of `readout` (CUDA)
        self._read_done: torch.cuda.Event | None = None
        if self.compile_requested:
            self._compile()
        if use_graphs:
            self._capture()

    @property
    def graph_count(self) -> int:
        return len(self.sample_graphs) + len(self.backbone_graphs)

    @property
    def compiled(self) -> bool:
        return any(view.compiled for view in self.views.values())

    def view(self, shape: tuple[int, int]) -> FrameStep:
        view = self.views.get(shape, self._extra.get(shape))
        if view is None:
            view = self._extra[shape] = self.step.narrow(shape[1], shape[0])
        return view

    # ---- start-up ----
    def _form(self, view: FrameStep) -> LayerForm:
        """The view's compiled form: it follows the view's row count (and the settings' `form`)."""
        return select_form(view.rows, compiled=True, requested=self.step.settings.form)

    def _set_compiled(self, on: bool, fallback: bool = False) -> None:
        """`fallback`: views whose form has a fallback (fastpath/forms.py) compile that form instead."""
        settings = self.step.settings
        for view in self.views.values():
            if on:
                form = self._form(view)
                view.use_compiled(lambda fn: compile_unit(fn, settings), fallback and fallback_of(form) or form)
            else:
                view.use_uncompiled()

    def _warm(self) -> None:
        for view in self.views.values():
            view.sample_frame()
        for view in self._backbone_view.values():
            for bucket in self.buckets:
                view.backbone_step(bucket)


    def _compile(self) -> None:
        """Compile every bucket view's units (Dynamo compiles on first call: one warm-up pass)."""
        t0 = time.perf_counter()
        kernel_forms = any(fallback_of(self._form(view)) for view in self.views.values())
        attempts = [False, True] if kernel_forms else [False]  # the forms asked for, then their fallbacks
        for i, fallback in enumerate(attempts):
            try:
                self._set_compiled(True, fallback)
                run_on_side_stream(self.step.device, self._warm)
                break
            except Exception as exc:  # compilation is an optimization: keep the uncompiled step
                then = ("trying the forms' fallbacks (forms without our Triton kernels)" if i + 1 < len(attempts)
                        else "running the batched step uncompiled")
                reason = f"torch.compile failed ({type(exc).__name__}: {exc}); {then}"
                self.compile_fallback_reason = (f"{self.compile_fallback_reason}; then {reason}"
                                                if self.compile_fallback_reason else reason)
                log.warning("%s", reason)
                self._set_compiled(False)
        self.compile_s = time.perf_counter() - t0
        if self.compiled:
            log.info("compiled the batched step for %d batch shapes in %.1f s", len(self.shapes), self.compile_s)

    def _capture(self) -> None:
        t0 = time.perf_counter()
        try:
            self._capture_all()
        except Exception as exc:
            if self.compiled:  # retry once with the uncompiled views before giving up on graphs
                self.compile_fallback_reason = (f"CUDA graph capture of the compiled batched step failed "
                                                f"({type(exc).__name__}: {exc}); capturing the uncompiled step")
                log.warning("%s", self.compile_fallback_reason)
                self._set_compiled(False)
                self.sample_graphs, self.backbone_graphs = {}, {}
                try:
                    self._capture_all()
                except Exception as again:
                    self._graphs_failed(again)
            else:
                self._graphs_failed(exc)
        self.capture_s = time.perf_counter() - t0
        if self.sample_graphs:
            log.info("captured %d CUDA graphs for %d batch shapes in %.2f s (compiled: %s)", self.graph_count,
                     len(self.shapes), self.capture_s, self.compiled)

    def _graphs_failed(self, exc: Exception) -> None:
        self.fallback_reason = (f"CUDA graph capture failed ({type(exc).__name__}: {exc}); "
                                "running the batched step eagerly")
        log.warning("%s", self.fallback_reason)
        self.sample_graphs, self.backbone_graphs = {}, {}

    def _capture_all(self) -> None:
        device = self.step.device
        pool = torch.cuda.graph_pool_handle()
        run_on_side_stream(self.step.device, self._warm)
        for shape, view in self.views.items():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                view.sample_frame()
            self.sample_graphs[shape] = graph
        for rows, view in self._backbone_view.items():
            for bucket in self.buckets:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    view.backbone_step(bucket)
                self.backbone_graphs[(rows, bucket)] = graph
        torch.cuda.synchronize(device)

    # ---- per step ----
    def sample_frame(self, shape: tuple[int, int], then=None) -> torch.Tensor:
        """Sample one frame for every stream of `shape` and return the host copy of `readout` [streams, 18]
        (the step's one host read). `then()`, if given, is queued on the device right behind the copy
        (the next backbone step): on CUDA the host waits for the copy only, so `then`'s work runs while
        the caller reads the frame."""
        graph = self.sample_graphs.get(shape)
        view = self.view(shape)
        if graph is not None:
            graph.replay()
        else:
            view.sample_frame()
        if view.readout.device.type != "cuda":
            out = view.readout.clone()
            if then is not None:
                then()
            return out
        staging, read_done = self._host, self._read_done
        if staging is None or read_done is None:  # created together, on the first CUDA read
            staging = self._host = torch.empty(self.step.readout.shape, dtype=self.step.readout.dtype,
                                               pin_memory=True)
            read_done = self._read_done = torch.cuda.Event()
        host = staging[: view.streams]
        host.copy_(view.readout, non_blocking=True)
        read_done.record()
        if then is not None:
            then()
        read_done.synchronize()
        return host.clone()

    def backbone_step(self, shape: tuple[int, int], bucket: int) -> None:
        graph = self.backbone_graphs.get((shape[1], bucket))
        if graph is not None:
            graph.replay()
        else:
            view = self._backbone_view.get(shape[1])
            (view if view is not None else self.view(shape)).backbone_step(bucket)
