"""The batched frame step's batch shapes: each one's view of the step's buffers, compiled or not, and its CUDA
graphs, built at start-up or, while the worker serves, in the background.

A shape is (streams, rows): the prefix of stream slots and model rows a step covers (`FrameStep.narrow` gives a
view of the one static cache with that prefix). `sample_frame` is captured per shape, the backbone step per
(shape, attention bucket). All graphs share one memory pool: their only live outputs are the step's static
buffers, and the engine thread replays them one at a time, so replaying them in any order is safe.

With compilation on (fastpath/compiled.py) a shape's view runs `torch.compile`d units (its layers' form follows
its row count), compiled by a warm-up pass before capture; Dynamo compiles once per distinct shape, so the
buckets are few (engine/batching.py `bucket_shapes`). The fallbacks are the batch-1 runner's (fastpath/graph.py):
a compile error retries the shape in its form's fallback (fastpath/forms.py: `gemm+attention` -> `gemm`, the
library's GEMMs only; `fused+chain+all` -> `units+attn`; a form that failed once is not tried again for later
shapes); another compile error leaves the shape uncompiled; a capture error of the compiled view retries it
uncompiled; a second capture error leaves the shape eager.

Building a shape (`build`) and the streams' safety. Every view is a prefix of the same buffers, and a warm-up
pass runs the step on the buffers it is given. At start-up, before any stream joins (`exclusive`), the warm-up
runs on the view itself, as capture requires. While streams are live, running a larger shape's step on the
step's buffers would overwrite their caches, sampling state and frame counters, so a background build warms up
(and compiles) on a scratch step of the shape's size (`FrameStep.scratch`: buffers of its own, shaped and
strided as the view's, so Dynamo's guards pass on the view and nothing compiles again), then captures the
view's graphs on a stream of its own in thread-local mode (`fastpath/graph.py capture_graph`), which records
the kernels without running them: the step's buffers are never touched. A built shape is published at once
(`built`, `ready_shapes`: what the engine thread steps with from its next step on); a shape built again (the
starter's compiled upgrade) replaces the old build, which is kept alive so that a replay in flight is never
freed under the device.

The starter (`starter` shapes) is built uncompiled, which takes seconds, so that a serving worker is ready for
one stream at once; `pending()` then lists what is left in the order it becomes useful: the starter's compiled
build, then each shape by the streams it covers. On the CPU the same views run eagerly (compiled if asked), and
"capturing" is publishing the view. Shapes outside the buckets (the CPU's exact prefixes) get uncompiled views
on first use: compiling a new shape while streams wait would stall them.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from breeze_worker.engine.fastpath.compiled import compile_unit
from breeze_worker.engine.fastpath.forms import LayerForm, fallback_of, select_form
from breeze_worker.engine.fastpath.graph import capture_graph
from breeze_worker.engine.fastpath.static_cache import buckets_up_to
from breeze_worker.engine.fastpath.step import FrameStep

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

log = logging.getLogger(__name__)

Shape = tuple[int, int]


def covered_streams(shape: Shape) -> int:
    """Streams a shape serves whatever their mix: each stream may use CFG (two rows)."""
    streams, rows = shape
    return min(streams, rows // 2)


def _dynamo_graphs() -> int:
    """Graphs Dynamo has compiled in this process (its counters)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@dataclass(frozen=True)
class Built:
    """One batch shape as the engine thread steps it: its view of the step's buffers and, on CUDA, its graphs."""

    view: FrameStep
    sample: torch.cuda.CUDAGraph | None = None
    backbone: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)  # attention bucket -> graph
    compile_s: float = 0.0
    capture_s: float = 0.0
    background: bool = False  # built while the worker served (warmed on a scratch step)

    @property
    def graphed(self) -> bool:
        return self.sample is not None


class ShapeGraphs:
    def __init__(self, step: FrameStep, shapes: list[Shape], use_graphs: bool, compile: bool = False,
                 starter: list[Shape] | None = None):
        """`starter` None: build every shape now (compiled where asked), before any stream joins (a bench, or a
        worker built whole before serving); else only those of `shapes` in `starter`, uncompiled, and the rest
        are `pending()` for `build` on a background thread."""
        self.step = step
        self.shapes = sorted(set(shapes))
        self.use_graphs = use_graphs
        self.compile_requested = bool(compile and self.shapes)
        self.buckets = buckets_up_to(step.cache.capacity)
        self.built: dict[Shape, Built] = {}
        self.ready_shapes: tuple[Shape, ...] = ()  # replaced whole on each publish (the engine thread reads it)
        self._retired: list[Built] = []  # builds a later one replaced: a replay may still be in flight
        self._extra: dict[Shape, FrameStep] = {}  # uncompiled views of non-bucket shapes
        self.fallback_reason: str | None = None
        self.compile_fallback_reason: str | None = None
        self.compile_s = 0.0
        self.capture_s = 0.0
        self.capture_recompiles = 0  # Dynamo graphs compiled while capturing (the warm-up should have compiled all)
        self._failed_forms: set[str] = set()  # forms whose compile failed here: later shapes go to the fallback
        self._compile_tried: set[Shape] = set()  # shapes whose compiled build ran (whatever came of it)
        self._stream: torch.cuda.Stream | None = None  # warm-ups and captures (CUDA)
        self._pool: _POOL_HANDLE | None = None  # the graphs' memory pool (CUDA)
        self._build_lock = threading.Lock()  # one build at a time
        self._host: torch.Tensor | None = None  # pinned host copy of `readout` (CUDA)
        self._read_done: torch.cuda.Event | None = None
        now = self.shapes if starter is None else [s for s in self.shapes if s in set(starter)]
        if now:
            self.build_all(now, compiled=self.compile_requested and starter is None, exclusive=True)
        if starter is None:
            self.log_totals()

    # (`built` grows on the builder's thread while others read it: each reader takes one snapshot of it)
    @property
    def graph_count(self) -> int:
        return sum(int(b.graphed) + len(b.backbone) for b in list(self.built.values()))

    @property
    def compiled(self) -> bool:
        return any(b.view.compiled for b in list(self.built.values()))

    @property
    def views(self) -> dict[Shape, FrameStep]:
        """The built shapes' views (the ones the engine steps with)."""
        return {shape: b.view for shape, b in list(self.built.items())}

    @property
    def complete(self) -> bool:
        """Every shape built, compiled where compiling was asked for and worked."""
        return not self.pending()

    def view(self, shape: Shape) -> FrameStep:
        built = self.built.get(shape)
        if built is not None:
            return built.view
        view = self._extra.get(shape)
        if view is None:
            view = self._extra[shape] = self.step.narrow(shape[1], shape[0])
        return view

    def pending(self) -> list[tuple[Shape, bool]]:
        """What is left to build, in the order it is useful: (shape, compiled). First the built shapes that run
        uncompiled while compiling was asked for (the starter), then the shapes not built yet by the streams
        they serve (`covered_streams`), fewest first."""
        built = set(self.ready_shapes)
        upgrades = [(shape, True) for shape in sorted(built)
                    if self.compile_requested and shape not in self._compile_tried]
        missing = sorted((s for s in self.shapes if s not in built), key=lambda s: (covered_streams(s), s[1]))
        return upgrades + [(shape, self.compile_requested) for shape in missing]

    def compile_pending(self, shape: Shape) -> bool:
        """Whether `shape` runs uncompiled now and a compiled build of it is still to come."""
        return self.compile_requested and shape not in self._compile_tried

    # ---- building ----
    def build(self, shape: Shape, compiled: bool, exclusive: bool = False) -> Built:
        """Build `shape` (compiled or not), capture its graphs (CUDA) and publish it. `exclusive`: no stream is
        live, so the warm-up may run on the step's own buffers; otherwise it runs on a scratch step."""
        return self.build_all([shape], compiled, exclusive)[shape]

    def build_all(self, shapes: list[Shape], compiled: bool, exclusive: bool = False) -> dict[Shape, Built]:
        """`build` for several shapes: compiled by one warm-up pass over all of them (every shape's frame, then
        every shape's backbone steps: the order Dynamo meets the shapes in, which decides what its automatic
        dynamic shapes compile), then each captured and published."""
        with self._build_lock:
            views = {shape: self.step.narrow(shape[1], shape[0]) for shape in shapes}
            warm_on = dict(views) if exclusive else {
                shape: self._on_stream(lambda s=shape: self.step.scratch(s[1], s[0])) for shape in shapes}
            t0 = time.perf_counter()
            if compiled:
                self._compile_tried.update(shapes)
                self._compile(views, warm_on)
            compile_s = (time.perf_counter() - t0) / max(1, len(shapes))
            out = {}
            for shape in shapes:
                view = views[shape]
                sample: torch.cuda.CUDAGraph | None = None
                backbone: dict[int, torch.cuda.CUDAGraph] = {}
                t1 = time.perf_counter()
                if self.use_graphs:
                    sample, backbone = self._capture(shape, view, warm_on[shape])
                out[shape] = Built(view, sample, backbone, compile_s if view.compiled else 0.0,
                                   time.perf_counter() - t1, background=not exclusive)
                self._publish(shape, out[shape])
            return out

    def _publish(self, shape: Shape, built: Built) -> None:
        old = self.built.get(shape)
        if old is not None:
            self._retired.append(old)
        self.built[shape] = built
        self.ready_shapes = tuple(sorted(self.built))
        self.compile_s += built.compile_s
        self.capture_s += built.capture_s

    def log_totals(self) -> None:
        """The build's totals, as one line each for the compile and the capture (what the benches read)."""
        if self.compiled:
            log.info("compiled the batched step for %d batch shapes in %.1f s", len(self.built), self.compile_s)
        if self.graph_count:
            log.info("captured %d CUDA graphs for %d batch shapes in %.2f s (compiled: %s)", self.graph_count,
                     len(self.built), self.capture_s, self.compiled)

    def _on_stream(self, work):
        """`work()` on the builders' CUDA stream, after what the current stream has queued, and waited for (on
        the CPU: just `work()`): warm-ups before a capture allocate library workspaces on the stream that
        captures."""
        device = self.step.device
        if device.type != "cuda":
            return work()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        self._stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(self._stream):
            out = work()
        self._stream.synchronize()
        return out

    def _warm(self, targets: list[FrameStep]) -> None:
        for target in targets:
            target.sample_frame()
        for target in targets:
            for bucket in self.buckets:
                target.backbone_step(bucket)

    def _compile(self, views: dict[Shape, FrameStep], warm_on: dict[Shape, FrameStep]) -> None:
        """Compile the views' units by one warm-up pass on `warm_on` (Dynamo compiles on first call), each in its
        form; when that fails, each in its form's fallback; uncompiled when that fails too. A form that failed
        is not tried again for a later build."""
        settings = self.step.settings
        forms = {shape: select_form(view.rows, compiled=True, requested=settings.form) for shape, view in views.items()}
        for level in (0, 1):
            chosen: dict[Shape, LayerForm] = {}
            for shape, form in forms.items():
                attempt = form if level == 0 else fallback_of(form)
                if attempt is not None and attempt.name not in self._failed_forms:
                    chosen[shape] = attempt
            if not chosen:
                continue
            targets = [warm_on[shape] for shape in chosen]
            try:
                for shape, form in chosen.items():
                    for target in {id(views[shape]): views[shape], id(warm_on[shape]): warm_on[shape]}.values():
                        target.use_compiled(lambda fn: compile_unit(fn, settings), form)
                self._on_stream(functools.partial(self._warm, targets))
                return
            except Exception as exc:  # compilation is an optimization: keep the uncompiled step
                self._failed_forms.update(form.name for form in chosen.values())
                names = ", ".join(sorted({f.name for f in chosen.values()}))
                then = ("trying the forms' fallbacks (forms without our Triton kernels)" if level == 0
                        else "running the batched step uncompiled")
                shapes = ", ".join(f"{s}x{r}" for s, r in chosen)
                self._compile_failed(f"torch.compile of batch shapes {shapes} ({names}) failed "
                                     f"({type(exc).__name__}: {exc}); {then}")
                for shape in views:
                    views[shape].use_uncompiled()
                    warm_on[shape].use_uncompiled()

    def _compile_failed(self, reason: str) -> None:
        self.compile_fallback_reason = (f"{self.compile_fallback_reason}; then {reason}"
                                        if self.compile_fallback_reason else reason)
        log.warning("%s", reason)

    def _capture(self, shape: Shape, view: FrameStep,
                 warm_on: FrameStep) -> tuple[torch.cuda.CUDAGraph | None, dict[int, torch.cuda.CUDAGraph]]:
        try:
            return self._capture_view(view, warm_on)
        except Exception as exc:
            if view.compiled:  # retry once with the uncompiled view before giving up on graphs
                self._compile_failed(f"CUDA graph capture of the compiled batch shape {shape[0]}x{shape[1]} failed "
                                     f"({type(exc).__name__}: {exc}); capturing it uncompiled")
                view.use_uncompiled()
                warm_on.use_uncompiled()
                try:
                    return self._capture_view(view, warm_on)
                except Exception as again:
                    exc = again
            reason = (f"CUDA graph capture of batch shape {shape[0]}x{shape[1]} failed ({type(exc).__name__}: "
                      f"{exc}); running that shape eagerly")
            self.fallback_reason = f"{self.fallback_reason}; {reason}" if self.fallback_reason else reason
            log.warning("%s", reason)
            return None, {}

    def _capture_view(self, view: FrameStep,
                      warm_on: FrameStep) -> tuple[torch.cuda.CUDAGraph, dict[int, torch.cuda.CUDAGraph]]:
        # libraries, workspaces and kernels ready on this thread and stream before the capture
        self._on_stream(lambda: self._warm([warm_on]))
        if warm_on is not view:
            self._on_stream(lambda: view.fused_workspace.reserve_like(warm_on.fused_workspace))
        assert self._stream is not None  # created by the warm-up (CUDA)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        compiled_before = _dynamo_graphs() if view.compiled else 0
        sample, _ = capture_graph(view.sample_frame, self._stream, self._pool)
        backbone: dict[int, torch.cuda.CUDAGraph] = {}
        for bucket in self.buckets:
            backbone[bucket], _ = capture_graph(functools.partial(view.backbone_step, bucket), self._stream, self._pool)
        self._stream.synchronize()
        if view.compiled and (again := _dynamo_graphs() - compiled_before):
            self.capture_recompiles += again
            log.warning("Dynamo compiled %d graph(s) again while capturing batch shape %dx%d on the step's buffers: "
                        "its guards did not hold for the view the warm-up did not run on", again, view.streams,
                        view.rows)
        return sample, backbone

    # ---- per step ----
    def sample_frame(self, shape: Shape, then=None) -> torch.Tensor:
        """Sample one frame for every stream of `shape` and return the host copy of `readout` [streams, 18]
        (the step's one host read). `then()`, if given, is queued on the device right behind the copy
        (the next backbone step): on CUDA the host waits for the copy only, so `then`'s work runs while
        the caller reads the frame."""
        built = self.built.get(shape)
        if built is not None and built.sample is not None:
            view = built.view
            built.sample.replay()
        else:
            view = self.view(shape)
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

    def backbone_step(self, shape: Shape, bucket: int) -> None:
        built = self.built.get(shape)
        graph = built.backbone.get(bucket) if built is not None else None
        if graph is not None:
            graph.replay()
        else:
            self.view(shape).backbone_step(bucket)
