"""The rest of the start-up, built while the worker serves (the `startup` setting's `progressive`).

Before SERVING, the runtime builds what one stream needs: the batched step's smallest batch shape (one stream,
with or without CFG) uncompiled in CUDA graphs, the text encoder's shapes for one stream's join, the codec's
one-slot batch, and a warm-up request through them (engine/runtime.py). `StartupBuild` then builds the rest on
a thread of its own, one piece at a time, in the order it is useful:

1. the compile bundle's torch cache, when the worker was given one (engine/bundle.py), before anything
   compiles; the reference encoder (model/codec: only requests cloning a voice need it; they wait for it, off
   the engine thread);
2. the starter shape's compiled build (until then a stream runs its uncompiled graphs, counted and logged);
3. each further batch shape by the streams it serves, each preceded by the codec batch and the text encoder's
   shapes those streams need, so that publishing the batch shape, which is what lets the engine admit more
   streams (BatchedStepper.ready_streams), comes last.

Its CUDA work runs on a stream of its own, and every graph is captured in thread-local mode without running
(engine/batch_graphs.py says why the streams being served are safe meanwhile). Compiling holds the interpreter
lock much of the time, and the engine thread gives it up at every CUDA call it makes; each time, it waits up
to the interpreter's switch interval to get it back, so while the build runs the switch interval is 0.1 ms
(`BUILD_SWITCH_INTERVAL_S`), then the configured one again (commands/serve.py `tune_interpreter`).
benchmarks/startup_bench.py measures what the streams served meanwhile get (TTFA, real-time factor).

A piece that fails is logged and the build stops there: the worker goes on serving the streams its built
shapes admit (the snapshot and the metrics say how many), as a worker that finished its start-up would, only
with fewer streams. `stop` asks it to end after the piece in progress.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext

import torch

from breeze_worker.engine.batch_graphs import covered_streams
from breeze_worker.engine.codec_graphs import bucket_for, pool_for

log = logging.getLogger(__name__)

BUILD_SWITCH_INTERVAL_S = 1e-4  # the interpreter's switch interval while the build runs (then the configured one)


class StartupBuild:
    def __init__(self, runtime, max_streams: int):
        self.runtime = runtime
        self.max_streams = max_streams
        self.building: str | None = None  # what is being built now
        self.failed: str | None = None  # why the build stopped early
        self.started_at: float | None = None  # time.monotonic()
        self.finished_at: float | None = None
        self.done = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[], None]] = []

    @property
    def stepper(self):
        return self.runtime.stepper

    def start(self, on_progress: Callable[[], None] | None = None) -> None:
        """Build the rest on a thread; `on_progress()` after each piece (the scheduler re-reads its capacity)."""
        if on_progress is not None:
            self._listeners.append(on_progress)
        self.started_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="breeze-startup", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the start-up build is still running %s; leaving it", self.building or "")

    def pending(self) -> list:
        graphs = getattr(self.stepper, "graphs", None)
        return graphs.pending() if graphs is not None else []

    def _run(self) -> None:
        device = self.runtime.device
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        # while this thread compiles it wants the interpreter lock nearly all the time: each time the engine
        # thread lets it go (every CUDA call) it waits up to a switch interval to get it back, so a short one
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, BUILD_SWITCH_INTERVAL_S))
        try:
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                self._build_all()
        except BaseException as exc:  # noqa: BLE001 - a bug or a device error: serve what is built
            self.failed = f"{type(exc).__name__}: {exc}"
            log.error("the start-up build stopped while building %s (%s); serving %d of %d streams", self.building,
                      self.failed, self.ready_streams, self.max_streams, exc_info=exc)
        finally:
            sys.setswitchinterval(switch)
            self.building = None
            self.finished_at = time.monotonic()
            self.done.set()
            self._notify()
            graphs = getattr(self.stepper, "graphs", None)
            if graphs is not None and self.failed is None and not self._stop.is_set():
                graphs.log_totals()
            if self.failed is None and not self._stop.is_set():
                log.info("full capacity: %d of %d streams ready and everything built as configured, %.1f s after "
                         "the worker started serving", self.ready_streams, self.max_streams,
                         self.finished_at - (self.started_at or 0.0))

    def _build_all(self) -> None:
        bundle = getattr(self.runtime, "bundle", None)
        if bundle is not None and bundle.pending:
            self._piece("the compile bundle's caches", bundle.install)
        codec = self.runtime.codec
        if not getattr(codec, "encoder_loaded", True):
            self._piece("the reference encoder", codec.load_encoder)
        pool = pool_for(codec)
        while not self._stop.is_set():
            pending = self.pending()
            if not pending:
                return
            shape, compiled = pending[0]
            slots = bucket_for(covered_streams(shape))
            if slots not in pool.built:
                self._piece(f"the codec's {slots}-slot batch", functools.partial(pool.ensure, slots))
            what = f"batch shape {shape[0]}x{shape[1]}" + (" compiled" if compiled else "")
            self._piece(what, self.stepper.build_next)

    def _piece(self, what: str, work: Callable[[], object]) -> None:
        self.building = what
        t0 = time.perf_counter()
        work()
        log.info("start-up, while serving: %s ready in %.1f s (%d of %d streams admitted now)", what,
                 time.perf_counter() - t0, self.ready_streams, self.max_streams)
        self._notify()

    def _notify(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # noqa: BLE001 - a listener's failure is its own
                log.exception("a start-up progress listener failed")

    @property
    def ready_streams(self) -> int:
        return int(getattr(self.stepper, "ready_streams", self.max_streams))
