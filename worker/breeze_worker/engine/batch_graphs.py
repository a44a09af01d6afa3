"""CUDA graphs for the batched frame step: one per batch-shape bucket, captured once at start-up.

A shape is (streams, rows): the prefix of stream slots and model rows a step covers (`FrameStep.narrow`
gives a view of the one static cache with that prefix). `sample_frame` is captured per shape; the backbone
step per (rows, attention bucket). All graphs share one memory pool: their only live outputs are the
step's static buffers, so replaying them in any order is safe.

Capture runs the step on the real buffers (warm-up runs, then capture), so it happens before any stream
joins; the caller resets the rows afterwards. On the CPU, or if capture fails (the reason is logged and
kept in `fallback_reason`), the same views run eagerly.
"""

from __future__ import annotations

import logging
import time

import torch

from breeze_worker.engine.fastpath.static_cache import buckets_up_to
from breeze_worker.engine.fastpath.step import FrameStep

log = logging.getLogger(__name__)


class ShapeGraphs:
    def __init__(self, step: FrameStep, shapes: list[tuple[int, int]], use_graphs: bool):
        self.step = step
        self.shapes = sorted(set(shapes))
        self.views = {shape: step.narrow(shape[1], shape[0]) for shape in self.shapes}
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
        self.capture_s = 0.0
        if use_graphs:
            self._capture()

    @property
    def graph_count(self) -> int:
        return len(self.sample_graphs) + len(self.backbone_graphs)

    def _capture(self) -> None:
        device = self.step.device
        t0 = time.perf_counter()
        try:
            pool = torch.cuda.graph_pool_handle()
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):  # warm-up runs allocate workspaces outside the captures
                for view in self.views.values():
                    view.sample_frame()
                for view in self._backbone_view.values():
                    for bucket in self.buckets:
                        view.backbone_step(bucket)
            torch.cuda.current_stream(device).wait_stream(side)
            torch.cuda.synchronize(device)
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
        except Exception as exc:  # capture is an optimization: serve on the same views, eagerly
            self.fallback_reason = (f"CUDA graph capture failed ({type(exc).__name__}: {exc}); "
                                    "running the batched step eagerly")
            log.warning("%s", self.fallback_reason)
            self.sample_graphs, self.backbone_graphs = {}, {}
        self.capture_s = time.perf_counter() - t0
        if self.sample_graphs:
            log.info("captured %d CUDA graphs for %d batch shapes in %.2f s", self.graph_count, len(self.shapes),
                     self.capture_s)

    # ---- per step ----
    def sample_frame(self, shape: tuple[int, int]) -> torch.Tensor:
        """Sample one frame for every stream of `shape`; returns the host copy of `readout` [streams, 18]
        (the step's one host read)."""
        graph = self.sample_graphs.get(shape)
        view = self.views[shape]
        if graph is not None:
            graph.replay()
        else:
            view.sample_frame()
        return view.readout.cpu()

    def backbone_step(self, shape: tuple[int, int], bucket: int) -> None:
        graph = self.backbone_graphs.get((shape[1], bucket))
        if graph is not None:
            graph.replay()
        else:
            self._backbone_view[shape[1]].backbone_step(bucket)
