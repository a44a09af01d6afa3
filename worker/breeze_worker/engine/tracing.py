"""A small span recorder for one process, written out as a Chrome / Perfetto trace (`chrome://tracing`,
https://ui.perfetto.dev).

Code marks its stages with named, nested spans and instant marks:

    with tracing.span("prefill"):
        ...
    tracing.mark("gpu_sync", site="engine/eager.py:140")

When no tracer is active (the normal case, and always while serving) `span` returns one shared no-op
context manager and `mark` returns at once: a global read and a call, nothing recorded, nothing
allocated. `Tracer.activate()` makes a tracer current for the whole process until it is deactivated.

Nesting in the written trace follows time containment on one thread (Chrome "X" complete events), so a
span opened inside a generator and left open across a `yield` contains whatever the consumer does before
resuming it (the eager generator's "frame" span contains the consumer's "codec_decode" and "emit").
`Tracer.stack()` gives the names of the spans open on the calling thread (innermost last).

Code that may run inside a CUDA graph capture (the fast path's frame step) uses `device_span(device, name)`:
while a capture is in progress on the current stream it is the no-op (a capture runs the Python once, so a
span there would time the recording, not the work). `Tracer(nvtx=True)` also opens an NVTX range per span
(visible in Nsight Systems next to the kernels), on CUDA builds only.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "breeze-trace/1"


@dataclass
class TraceEvent:
    """One recorded span (`dur_ns` set) or instant mark (`dur_ns` None); times are perf_counter_ns."""

    name: str
    start_ns: int
    dur_ns: int | None
    thread: int
    args: dict[str, Any] = field(default_factory=dict)


class _NoSpan:
    """The shared do-nothing span (tracing off)."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def next(self, **args) -> None:  # as a span sequence
        return None

    def close(self) -> None:
        return None


_NO_SPAN = _NoSpan()
_ACTIVE: Tracer | None = None


class _Span:
    __slots__ = ("tracer", "name", "args", "start_ns", "thread", "nvtx_id")

    def __init__(self, tracer: Tracer, name: str, args: dict[str, Any]):
        self.tracer, self.name, self.args = tracer, name, args
        self.start_ns = 0
        self.thread = 0
        self.nvtx_id = None

    def __enter__(self) -> _Span:
        self.thread = threading.get_ident()
        self.tracer._stack().append(self)
        if self.tracer.nvtx is not None:  # start/end ranges: spans left open across a yield need not nest
            self.nvtx_id = self.tracer.nvtx.range_start(self.name)
        self.start_ns = time.perf_counter_ns()
        return self

    def __exit__(self, *exc) -> None:
        end = time.perf_counter_ns()
        if self.nvtx_id is not None:
            self.tracer.nvtx.range_end(self.nvtx_id)
        stack = self.tracer._stack()
        if stack and stack[-1] is self:
            stack.pop()
        elif self in stack:  # closed out of order (interleaved generators): drop just this one
            stack.remove(self)
        self.tracer._record(TraceEvent(self.name, self.start_ns, end - self.start_ns, self.thread, self.args))


class _SpanSequence:
    """Back-to-back spans of one name (`next()` closes the open one and opens another); for loops whose
    iterations do not line up with a Python block, such as a generator's frames across `yield`."""

    def __init__(self, tracer: Tracer, name: str):
        self.tracer, self.name = tracer, name
        self._open: _Span | None = None

    def next(self, **args) -> None:
        self.close()
        self._open = _Span(self.tracer, self.name, args)
        self._open.__enter__()

    def close(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None

    def __enter__(self) -> _SpanSequence:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Tracer:
    """Records spans and marks from every thread while active; `chrome_trace()` / `write()` export them."""

    def __init__(self, process_name: str = "breeze-worker", nvtx: bool = False):
        self.process_name = process_name
        self.nvtx = _nvtx_module() if nvtx else None  # torch.cuda.nvtx, or None (off, or no CUDA)
        self.events: list[TraceEvent] = []
        self.origin_ns = time.perf_counter_ns()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._thread_names: dict[int, str] = {}

    # ---- recording ----
    def _stack(self) -> list[_Span]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
            self._thread_names.setdefault(threading.get_ident(), threading.current_thread().name)
        return stack

    def _record(self, event: TraceEvent) -> None:
        with self._lock:
            self.events.append(event)

    def span(self, name: str, **args) -> _Span:
        return _Span(self, name, args)

    def span_sequence(self, name: str) -> _SpanSequence:
        return _SpanSequence(self, name)

    def mark(self, name: str, **args) -> None:
        self._stack()  # registers the thread's name
        self._record(TraceEvent(name, time.perf_counter_ns(), None, threading.get_ident(), args))

    def add_span(self, name: str, start_ns: int, end_ns: int, **args) -> None:
        """Record a span measured elsewhere (perf_counter_ns clock), e.g. stage times a component reports."""
        self._stack()
        self._record(TraceEvent(name, start_ns, max(end_ns - start_ns, 0), threading.get_ident(), args))

    def stack(self) -> list[str]:
        """Names of the spans open on this thread, outermost first."""
        return [s.name for s in self._stack()]

    # ---- activation ----
    def activate(self) -> Tracer:
        global _ACTIVE
        _ACTIVE = self
        return self

    def deactivate(self) -> None:
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None

    @contextlib.contextmanager
    def recording(self) -> Iterator[Tracer]:
        """Active inside the block (the previously active tracer, if any, is restored after)."""
        previous = _ACTIVE
        self.activate()
        try:
            yield self
        finally:
            globals()["_ACTIVE"] = previous

    # ---- export ----
    def chrome_trace(self, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """The Chrome trace-event JSON object (times in microseconds from the tracer's creation)."""
        pid = os.getpid()
        tids = {thread: i + 1 for i, thread in enumerate(sorted({e.thread for e in self.events}))}
        out: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": self.process_name}}]
        for thread, tid in tids.items():
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                        "args": {"name": self._thread_names.get(thread, f"thread-{tid}")}})
        with self._lock:
            events = sorted(self.events, key=lambda e: (e.start_ns, -(e.dur_ns or 0)))
        for e in events:
            base = {"name": e.name, "cat": "sync" if e.dur_ns is None else "engine", "pid": pid,
                    "tid": tids[e.thread], "ts": (e.start_ns - self.origin_ns) / 1000.0,
                    "args": _jsonable(e.args)}
            if e.dur_ns is None:
                out.append({**base, "ph": "i", "s": "t"})
            else:
                out.append({**base, "ph": "X", "dur": e.dur_ns / 1000.0})
        return {"traceEvents": out, "displayTimeUnit": "ms",
                "otherData": {"schema": SCHEMA, **_jsonable(metadata or {})}}

    def write(self, path: str | Path, metadata: dict[str, Any] | None = None) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.chrome_trace(metadata)) + "\n")
        return path


def _nvtx_module():
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.nvtx


def _jsonable(args: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, (str, int, float, bool)) or v is None else str(v)) for k, v in args.items()}


# ---- the module-level API used by instrumented code (cheap when tracing is off) ----


def active() -> Tracer | None:
    return _ACTIVE


def span(name: str, **args):
    """A context manager recording `name` on the active tracer; a shared no-op when tracing is off."""
    tracer = _ACTIVE
    return _NO_SPAN if tracer is None else tracer.span(name, **args)


def span_sequence(name: str):
    """Back-to-back spans of one name (`.next(**args)`, `.close()`); a no-op when tracing is off."""
    tracer = _ACTIVE
    return _NO_SPAN if tracer is None else tracer.span_sequence(name)


def mark(name: str, **args) -> None:
    """An instant mark on the active tracer (nothing when tracing is off)."""
    tracer = _ACTIVE
    if tracer is not None:
        tracer.mark(name, **args)


def device_span(device, name: str, **args):
    """`span(name)`, except the no-op while a CUDA graph is being captured on the current stream of a CUDA
    `device` (code that graphs capture calls this; off, it costs one global read)."""
    tracer = _ACTIVE
    if tracer is None:
        return _NO_SPAN
    if getattr(device, "type", None) == "cuda":
        import torch

        if torch.cuda.is_current_stream_capturing():
            return _NO_SPAN
    return tracer.span(name, **args)
