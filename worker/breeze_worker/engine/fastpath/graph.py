"""CUDA graphs over a `FrameStep`: one graph for `sample_frame`, one per attention bucket for
`backbone_step`, captured once per batch shape at warm-up and replayed with one host read per frame.

With compilation on (fastpath/compiled.py) the step's units are `torch.compile`d first and the compiled
code is what the graphs capture; a compile error is logged (`compile_fallback_reason`) and the uncompiled
step is captured instead. The backbone prefill is captured too, one graph per prompt-length bucket
(`PROMPT_BUCKETS`, the prompt left-padded to the bucket), on first use of that bucket.

`FrameRunner` hides whether graphs are in use: on the CPU, or when capture fails (the reason is logged and
kept in `fallback_reason`), it runs the same static-cache step eagerly. A pool of runners per
(model, rows, capacity) lets concurrent requests of the same shape each own their buffers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.fastpath.compiled import compile_unit, compile_wanted, sampling_kernel_wanted
from breeze_worker.engine.fastpath.forms import LayerForm, fallback_of, select_form
from breeze_worker.engine.fastpath.static_cache import bucket_for, buckets_up_to
from breeze_worker.engine.fastpath.step import FrameStep

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

log = logging.getLogger(__name__)
T = TypeVar("T")

PROMPT_BUCKETS = (64, 128, 256, 512, 1024)


def run_on_side_stream(device: torch.device, work) -> None:
    """Run `work()` on a side CUDA stream and wait for it: warm-up runs before a capture, so workspaces and
    library handles are allocated outside it (on the CPU: just `work()`)."""
    if device.type != "cuda":
        work()
        return
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        work()
    torch.cuda.current_stream(device).wait_stream(side)
    # the side stream waited for this thread's earlier work, so its end is the end of both; a device-wide
    # synchronize would also wait on another thread's stream, which CUDA refuses while that stream captures
    side.synchronize()


def capture_graph(work: Callable[[], T], stream: torch.cuda.Stream,
                  pool: _POOL_HANDLE | None = None) -> tuple[torch.cuda.CUDAGraph, T]:
    """Capture `work()` into a new CUDA graph on `stream` and return it with `work`'s result. The capture
    records without running anything, in thread-local mode: other threads (the engine thread serving
    streams) go on with their own CUDA work meanwhile. Unlike `torch.cuda.graph`, it neither synchronizes the
    device nor empties the allocator's cache first, either of which would stall a serving engine thread.
    Whatever `work` needs allocated beforehand (library handles and workspaces, Triton kernels loaded) must
    have been by a warm-up on this thread and `stream`."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            out = work()
        except BaseException:
            try:
                graph.capture_end()
            except Exception:  # noqa: BLE001 - the capture is invalid anyway; `work`'s error says why
                pass
            raise
        graph.capture_end()
    return graph, out


class FrameRunner:
    pad_prompts_without_graphs = False  # tests: pad prompts to their bucket on the CPU too

    def __init__(self, lm, rows: int, capacity: int, device: torch.device, use_graphs: bool | None = None,
                 settings: FastPathSettings | None = None):
        """`settings`: the fast path's (None: the defaults): whether to compile, the compiled form, the sampler,
        the kernels' launch settings, the read overlap. Part of the pool key."""
        self.settings = settings = settings or FastPathSettings()
        # who draws the codes (fastpath/fused_sampling.py or engine/sampling.py)
        self.sampler_requested = "kernel" if sampling_kernel_wanted(device, settings) else "torch"
        self.step = FrameStep(lm, rows=rows, streams=1, capacity=capacity, device=device, settings=settings,
                              sample_kernel=self.sampler_requested == "kernel")
        self.device, self.capacity = device, capacity
        self.use_graphs = device.type == "cuda" if use_graphs is None else use_graphs
        self.sample_graph: torch.cuda.CUDAGraph | None = None
        self.backbone_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # per prompt bucket: the graph and its static inputs (embeds, positions, allowed)
        self.prefill_graphs: dict[int, tuple[torch.cuda.CUDAGraph,
                                             tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
        self.fallback_reason: str | None = None
        self.compile_fallback_reason: str | None = None
        self.warmup_s = 0.0
        self.compile_s = 0.0
        self._prompt_pool: _POOL_HANDLE | None = None
        self._ring: list[tuple[torch.Tensor, torch.cuda.Event | None]] = []  # launch_frame's readout copies
        self._ring_next = 0
        self.compile_requested = compile_wanted(device, settings)
        # the compiled layers' form (fastpath/forms.py), fixed at creation
        self.form_requested: LayerForm | None = None
        if self.compile_requested:
            self.form_requested = select_form(rows, compiled=True, requested=settings.form)
            self._compile(self.form_requested)
        if self.use_graphs:
            self._capture()

    @property
    def compiled(self) -> bool:
        return self.step.compiled

    def _warm(self) -> None:
        for _ in range(2):
            self.step.sample_frame()
            for bucket in buckets_up_to(self.capacity):
                self.step.backbone_step(bucket)

    def _compile(self, form_requested: LayerForm) -> None:
        """Compile the step's units in `form_requested` and run them once (compilation happens on first call)."""
        t0 = time.perf_counter()
        kernel = self.sampler_requested == "kernel"
        attempts = [(form_requested, kernel)]
        if kernel:  # the sampling kernel failed to build here: the torch sampler
            attempts.append((form_requested, False))
        fallback = fallback_of(form_requested)
        if fallback is not None:  # the form's Triton kernels failed: its fallback, without them
            attempts.append((fallback, False))
        for i, (form, sample_kernel) in enumerate(attempts):
            try:
                self.step.use_compiled(lambda fn: compile_unit(fn, self.settings), form, sample_kernel=sample_kernel)
                run_on_side_stream(self.device, self._warm)
                break
            except Exception as exc:  # compilation is an optimization: keep the uncompiled step
                then = (f"trying form {attempts[i + 1][0].name} with the "
                        f"{'kernel' if attempts[i + 1][1] else 'torch'} sampler" if i + 1 < len(attempts)
                        else "running uncompiled")
                self.compile_fallback_reason = f"torch.compile failed ({type(exc).__name__}: {exc}); {then}"
                log.warning("%s", self.compile_fallback_reason)
                self.step.use_uncompiled(sample_kernel=False)
        self.compile_s = time.perf_counter() - t0
        if self.step.compiled:
            log.info("compiled the frame step for %d rows in %.1f s", self.step.rows, self.compile_s)


    def _capture(self) -> None:
        t0 = time.perf_counter()
        try:
            self._capture_frame_graphs()
        except Exception as exc:
            if self.step.compiled:  # retry once with the uncompiled step before giving up on graphs
                self.compile_fallback_reason = (f"CUDA graph capture of the compiled step failed "
                                                f"({type(exc).__name__}: {exc}); capturing the uncompiled step")
                log.warning("%s", self.compile_fallback_reason)
                self.step.use_uncompiled(sample_kernel=False)
                self.sample_graph, self.backbone_graphs = None, {}
                try:
                    self._capture_frame_graphs()
                except Exception as again:
                    self._graphs_failed(again)
            else:
                self._graphs_failed(exc)
        self.warmup_s = time.perf_counter() - t0 + self.compile_s
        if self.use_graphs:
            log.info("captured %d CUDA graphs for %d rows in %.2f s (compiled: %s)", 1 + len(self.backbone_graphs),
                     self.step.rows, self.warmup_s, self.step.compiled)

    def _graphs_failed(self, exc: Exception) -> None:
        self.fallback_reason = f"CUDA graph capture failed ({type(exc).__name__}: {exc}); running the step eagerly"
        log.warning("%s", self.fallback_reason)
        self.use_graphs = False
        self.sample_graph, self.backbone_graphs = None, {}

    def _capture_frame_graphs(self) -> None:
        if True:
            pool = torch.cuda.graph_pool_handle()
            run_on_side_stream(self.device, self._warm)
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

    # ---- prompt ----
    def prompt_slots(self, length: int, frames: int) -> int:
        """Cache slots the prompt takes: `length` padded up to a prompt bucket when graphs are in use and
        the padded prompt still leaves room for `frames` frames."""
        if not (self.use_graphs or self.pad_prompts_without_graphs):
            return length
        for bucket in PROMPT_BUCKETS:
            if length <= bucket:
                return bucket if bucket + frames + 1 <= self.capacity else length
        return length

    def prefill(self, embeds: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, slots: int) -> None:
        """The backbone prefill of every row: the left-padded prompt [R, T, H] padded further on the left to
        `slots` (from `prompt_slots`); replayed from a graph per bucket when graphs are in use."""
        rows, length = embeds.shape[:2]
        if slots == length:
            self.step.prefill(slice(0, rows), embeds, positions, allowed)
            return
        if not self.use_graphs:  # the padded prompt, eagerly (tests check padding changes no frame)
            static = (torch.zeros(rows, slots, embeds.shape[2], dtype=embeds.dtype, device=self.device),
                      torch.ones(rows, slots, dtype=torch.int64, device=self.device),
                      torch.zeros(rows, slots, dtype=torch.bool, device=self.device))
            self._fill_prompt(static, embeds, positions, allowed)
            self.step.prefill(slice(0, rows), *static)
            return
        entry = self.prefill_graphs.get(slots)
        if entry is None:
            static = (torch.zeros(rows, slots, embeds.shape[2], dtype=embeds.dtype, device=self.device),
                      torch.ones(rows, slots, dtype=torch.int64, device=self.device),
                      torch.zeros(rows, slots, dtype=torch.bool, device=self.device))
            self._fill_prompt(static, embeds, positions, allowed)
            # runs it for this request
            run_on_side_stream(self.device, lambda: self.step.prefill(slice(0, rows), *static))
            try:
                if self._prompt_pool is None:
                    self._prompt_pool = torch.cuda.graph_pool_handle()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._prompt_pool):
                    self.step.prefill(slice(0, rows), *static)
                self.prefill_graphs[slots] = (graph, static)
            except Exception as exc:  # no graph for this bucket: the result of the eager run above stands
                log.warning("prefill graph capture for %d slots failed (%s: %s); prefill runs eagerly", slots,
                            type(exc).__name__, exc)
                run_on_side_stream(self.device, lambda: self.step.prefill(slice(0, rows), *static))
            return
        graph, static = entry
        self._fill_prompt(static, embeds, positions, allowed)
        graph.replay()

    @staticmethod
    def _fill_prompt(static: tuple[torch.Tensor, ...], embeds: torch.Tensor, positions: torch.Tensor,
                     allowed: torch.Tensor) -> None:
        s_embeds, s_positions, s_allowed = static
        pad = s_embeds.shape[1] - embeds.shape[1]
        s_embeds[:, :pad].zero_()
        s_embeds[:, pad:].copy_(embeds)
        s_positions[:, :pad].fill_(1)  # padding positions as the prompt builder writes them
        s_positions[:, pad:].copy_(positions)
        s_allowed[:, :pad].fill_(False)
        s_allowed[:, pad:].copy_(allowed)

    # ---- per frame ----
    def sample_frame(self, then: Callable[[], None] | None = None) -> tuple[torch.Tensor, bool]:
        """Sample one frame; returns the host copy of `readout` [streams, 18] (the frame's one host read) and
        whether `then` ran. `then` (the next frame's backbone step) runs before the read where
        the settings' `read_overlap` is on: it queues its work behind the readout's copy (`launch_frame`), and the host
        waits for that copy only, so the device goes on to the backbone step without waiting for the host.
        Its work is in the same order either way; the caller runs `then` itself when this returns False."""
        slot = self.launch_frame()
        queued = False
        if then is not None and self.settings.read_overlap:
            then()
            queued = True
        return self.read_frame(slot), queued

    def launch_frame(self) -> int:
        """Queue one frame's sampling and a copy of its `readout` (pinned memory behind an event on CUDA)
        into one of two slots; returns the slot for `read_frame`. Two frames may be in flight: the copy is
        queued before the next frame's sampling rewrites `readout`."""
        if not self._ring:
            for _ in range(2):
                if self.device.type == "cuda":
                    self._ring.append((torch.empty(self.step.readout.shape, dtype=self.step.readout.dtype,
                                                   pin_memory=True), torch.cuda.Event()))
                else:
                    self._ring.append((torch.empty_like(self.step.readout), None))
        if self.sample_graph is not None:
            self.sample_graph.replay()
        else:
            self.step.sample_frame()
        slot = self._ring_next
        self._ring_next = 1 - slot
        buffer, event = self._ring[slot]
        buffer.copy_(self.step.readout, non_blocking=event is not None)
        if event is not None:
            event.record()
        return slot

    def read_frame(self, slot: int) -> torch.Tensor:
        """The host copy of the frame launched into `slot` (the frame's one host read)."""
        buffer, event = self._ring[slot]
        if event is None:
            return buffer.cpu()  # the CPU's read (measure/syncaudit.py counts it)
        event.synchronize()
        return buffer.clone()

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


def acquire_runner(lm, rows: int, capacity: int, device: torch.device,
                   settings: FastPathSettings | None = None) -> FrameRunner:
    """A free runner of this shape and settings (captured at its creation), or a new one."""
    settings = settings or FastPathSettings()
    key = (id(lm), rows, capacity, str(device), settings)
    with _LOCK:
        free = _POOLS.setdefault(key, [])
        if free:
            return free.pop()
    return FrameRunner(lm, rows, capacity, device, settings=settings)


def release_runner(lm, runner: FrameRunner) -> None:
    key = (id(lm), runner.step.rows, runner.capacity, str(runner.device), runner.settings)
    with _LOCK:
        _POOLS.setdefault(key, []).append(runner)


def clear_runners() -> None:
    """Drop every pooled runner (tests, or before loading another model)."""
    with _LOCK:
        _POOLS.clear()
