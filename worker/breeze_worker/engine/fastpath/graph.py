"""CUDA graphs over a `FrameStep`: one graph for `sample_frame`, one per attention bucket for
`backbone_step`, captured once per batch shape at warm-up and replayed with one host read per frame.

`FrameRunner` hides whether graphs are in use: on the CPU, or when capture fails (the reason is logged and
kept in `fallback_reason`), it runs the same static-cache step eagerly. A pool of runners per
(model, rows, capacity) lets concurrent requests of the same shape each own their buffers.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from breeze_worker.engine.fastpath.static_cache import bucket_for, buckets_up_to
from breeze_worker.engine.fastpath.step import FrameStep

log = logging.getLogger(__name__)


class FrameRunner:
    def __init__(self, lm, rows: int, capacity: int, device: torch.device, use_graphs: bool | None = None):
        self.step = FrameStep(lm, rows=rows, streams=1, capacity=capacity, device=device)
        self.device, self.capacity = device, capacity
        self.use_graphs = device.type == "cuda" if use_graphs is None else use_graphs
        self.sample_graph: torch.cuda.CUDAGraph | None = None
        self.backbone_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.fallback_reason: str | None = None
        self.warmup_s = 0.0
        if self.use_graphs:
            self._capture()

    def _capture(self) -> None:
        t0 = time.perf_counter()
        try:
            pool = torch.cuda.graph_pool_handle()
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up runs allocate workspaces outside the capture
                for _ in range(2):
                    self.step.sample_frame()
                    for bucket in buckets_up_to(self.capacity):
                        self.step.backbone_step(bucket)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.step.sample_frame()
            self.sample_graph = graph
            for bucket in buckets_up_to(self.capacity):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.step.backbone_step(bucket)
                self.backbone_graphs[bucket] = graph
            torch.cuda.synchronize(self.device)
        except Exception as exc:  # capture is an optimization: serve on the same step, eagerly
            self.fallback_reason = f"CUDA graph capture failed ({type(exc).__name__}: {exc}); running the step eagerly"
            log.warning("%s", self.fallback_reason)
            self.use_graphs = False
            self.sample_graph, self.backbone_graphs = None, {}
        self.warmup_s = time.perf_counter() - t0
        if self.use_graphs:
            log.info("captured %d CUDA graphs for %d rows in %.2f s", 1 + len(self.backbone_graphs),
                     self.step.rows, self.warmup_s)

    # ---- per frame ----
    def sample_frame(self) -> torch.Tensor:
        """Sample one frame; returns the host copy of `readout` [streams, 18] (the frame's one host read)."""
        if self.sample_graph is not None:
            self.sample_graph.replay()
        else:
            self.step.sample_frame()
        return self.step.readout.cpu()

    def backbone_step(self, next_slot: int) -> None:
        """Queue the backbone step writing slot `next_slot` (known on the host: no read needed)."""
        bucket = bucket_for(next_slot + 1, self.capacity)
        graph = self.backbone_graphs.get(bucket)
        if graph is not None:
            graph.replay()
        else:
            self.step.backbone_step(bucket)


_POOLS: dict[tuple, list[FrameRunner]] = {}
_LOCK = threading.Lock()


def acquire_runner(lm, rows: int, capacity: int, device: torch.device) -> FrameRunner:
    """A free runner of this shape (captured at its creation), or a new one."""
    key = (id(lm), rows, capacity, str(device))
    with _LOCK:
        free = _POOLS.setdefault(key, [])
        if free:
            return free.pop()
    return FrameRunner(lm, rows, capacity, device)


def release_runner(lm, runner: FrameRunner) -> None:
    key = (id(lm), runner.step.rows, runner.capacity, str(runner.device))
    with _LOCK:
        _POOLS.setdefault(key, []).append(runner)


def clear_runners() -> None:
    """Drop every pooled runner (tests, or before loading another model)."""
    with _LOCK:
        _POOLS.clear()
