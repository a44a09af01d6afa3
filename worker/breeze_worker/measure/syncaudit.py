"""Find host synchronizations at run time, with the source line that caused each.

A *host sync* is any operation after which the host must wait for the device: reading a value
(`.item()`, `bool(t)`, `int(t)`, `.tolist()`), copying to the host (`.cpu()`, `.to("cpu")`, `.numpy()`),
copying host data to the device without `non_blocking` (`torch.tensor(data, device=...)`, `.to(device)`:
a pageable copy waits for the stream), and data-dependent shapes (`nonzero`, `masked_select`, boolean-mask
indexing, `unique`, one-argument `torch.where`, `repeat_interleave` without `output_size`,
`torch.multinomial`), comparisons that return a Python bool (`torch.equal`, `torch.allclose`), and the
explicit waits (`torch.cuda.synchronize()`, `Stream.synchronize()`, `Event.synchronize()`).

`SyncDetector` (a context manager) sees them with two PyTorch modes: a `TorchFunctionMode` for the
Python-level calls (the tensor methods above and the tensor factories) and a `TorchDispatchMode` for the
ATen operators that synchronize wherever they are called from (`aten._local_scalar_dense`,
`aten.nonzero`, ...); a sync found at the Python level is not counted again by the ATen level. The explicit
waits are not tensor operations: while a detector is active (on the thread that entered it) it wraps
`torch.cuda.synchronize`, `torch.cuda.Stream.synchronize` and `torch.cuda.Event.synchronize`, and restores
them on exit. Each sync names the first stack frame in `breeze_worker` code (`site`) and the innermost
Python frame (`origin`).

On CUDA a tensor is "on the device" when it is a CUDA tensor. On the CPU there is no real sync, so the
detector *emulates* a device: every tensor counts as a device tensor (those that existed before the
detector started too: the weights) except the host ones, which are those created without a `device=`
argument or with the literal `"cpu"`, those produced by a host copy (`.cpu()`, `.to("cpu")`: the copy is
made real when PyTorch would return the same object), and the results of operations on host tensors only.
A `torch.device` object, or any device value other than the string "cpu", names the device. So the same
code gives the same counts on the CPU as on a GPU. `torch.cuda.set_sync_debug_mode` is the ground truth on
CUDA (measure/audit.py cross-checks with it; on an H200 both count 18 per eager frame and 1 per fast one).
"""

from __future__ import annotations

import contextlib
import linecache
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from breeze_worker.engine import tracing

_PACKAGE = "breeze_worker"
_THIS = __name__
_TORCH_DIR = str(Path(torch.__file__).parent)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding breeze_worker/

_T = torch.Tensor
READS = {_T.item: "item", _T.__bool__: "bool", _T.__int__: "int", _T.__float__: "float", _T.__index__: "index",
         _T.tolist: "tolist"}
# comparisons whose result is a Python bool: a read of a value computed from every tensor argument
COMPARE_READS = {torch.equal: "equal", _T.equal: "equal", torch.allclose: "allclose", _T.allclose: "allclose"}
HOST_COPIES = {_T.cpu: "cpu", _T.numpy: "numpy"}
# explicit waits for the device, wrapped while a detector is active: (owner, attribute, op)
EXPLICIT_WAITS = ((torch.cuda, "synchronize", "synchronize"), (torch.cuda.Stream, "synchronize", "stream_synchronize"),
                  (torch.cuda.Event, "synchronize", "event_synchronize"))
DATA_FACTORIES = {torch.tensor: "tensor", torch.as_tensor: "as_tensor"}
_aten = torch.ops.aten
ATEN_SYNCS = {
    _aten._local_scalar_dense.default: "item",
    _aten.nonzero.default: "nonzero",
    _aten.masked_select.default: "masked_select",
    _aten.multinomial.default: "multinomial",
    _aten._unique2.default: "unique",
    _aten.unique_dim.default: "unique",
    _aten.unique_consecutive.default: "unique",
    _aten.repeat_interleave.Tensor: "repeat_interleave",
    _aten.equal.default: "equal",
}
_INDEX_OPS = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default}
# a sync is part of a request's setup (not of a frame) when one of these spans is open (engine/tracing.py)
# or one of these functions is on the stack
SETUP_SPANS = frozenset({"text_encode", "prefill"})
SETUP_FUNCTIONS = frozenset({"prepare_prompt_embeddings", "gather_prompts", "prompt_text_segments", "encode_segments",
                             "encode_flat", "from_params", "prefill", "set_stream", "set_streams", "acquire_runner",
                             "_capture"})


@contextlib.contextmanager
def watch_waits(on_wait: Callable[[str], None]):
    """While open, each explicit wait for the device (EXPLICIT_WAITS) made on the thread that opened it
    calls `on_wait(op)` before it waits. The originals are put back on exit (an inherited attribute is
    removed again)."""
    thread = threading.get_ident()
    wrapped = []
    for owner, name, op in EXPLICIT_WAITS:
        own = name in vars(owner)
        original = getattr(owner, name)

        def wait(*args, _original=original, _op=op, **kwargs):
            if threading.get_ident() == thread:
                on_wait(_op)
            return _original(*args, **kwargs)

        setattr(owner, name, wait)
        wrapped.append((owner, name, original if own else None))
    try:
        yield
    finally:
        for owner, name, original in reversed(wrapped):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


@dataclass(frozen=True)
class SyncEvent:
    op: str  # what synchronized: item, bool, cpu, numpy, tolist, h2d, nonzero, mask_index, ...
    site: str  # first frame in breeze_worker code, "breeze_worker/engine/eager.py:171"
    function: str  # its function
    code: str  # its source line
    origin: str  # the innermost Python frame (may be outside breeze_worker, e.g. a test or a library)
    setup: bool = False  # during prompt encoding / prefill / stream setup rather than a frame
    frame: int | None = None  # the caller's `SyncDetector.frame` when it happened

    def to_dict(self) -> dict:
        return asdict(self)


def _describe(frame) -> tuple[str, str, str]:
    filename = frame.f_code.co_filename
    rel = filename[len(_PACKAGE_ROOT) + 1:] if filename.startswith(_PACKAGE_ROOT) else filename
    return f"{rel}:{frame.f_lineno}", frame.f_code.co_name, linecache.getline(filename, frame.f_lineno).strip()


def locate() -> tuple[str, str, str, str, bool]:
    """(site, function, code, origin, setup) of the caller: see `SyncEvent`."""
    frame: FrameType | None = sys._getframe(1)
    origin = found = None
    setup = False
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != _THIS and not frame.f_code.co_filename.startswith(_TORCH_DIR):
            if origin is None:
                origin = _describe(frame)[0]
            if found is None and module.startswith(_PACKAGE + "."):
                found = _describe(frame)
            if module.startswith(_PACKAGE + ".") and frame.f_code.co_name in SETUP_FUNCTIONS:
                setup = True
        frame = frame.f_back
    tracer = tracing.active()
    if tracer is not None and SETUP_SPANS.intersection(tracer.stack()):
        setup = True
    if found is None:
        return "<outside breeze_worker>", "", "", origin or "<unknown>", setup
    return (*found, origin or found[0], setup)


def _tensors(args, kwargs) -> list[torch.Tensor]:
    out = []
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _to_target(args, kwargs) -> tuple[object, bool]:
    """The device argument of Tensor.to(...) (None when only the dtype changes) and non_blocking."""
    kwargs = kwargs or {}
    target = kwargs.get("device")
    for a in args[1:]:
        if isinstance(a, (str, torch.device, int)) and not isinstance(a, bool):
            target = a
        elif isinstance(a, torch.Tensor):
            target = a.device
    non_blocking = bool(kwargs.get("non_blocking", False)) or any(a is True for a in args[1:])
    return target, non_blocking


class SyncDetector:
    """Record host syncs while active (`with SyncDetector(device) as d:`); `d.events` in order.

    `on_sync(event)` is called for every sync (e.g. to put a mark in a trace). `frame` (an int set by the
    caller) is copied into each event, so a loop can attribute syncs to frames; `paused()` stops
    recording, for the caller's own bookkeeping.
    """

    def __init__(self, device: torch.device | str, on_sync: Callable[[SyncEvent], None] | None = None):
        self.device = torch.device(device)
        self.emulated = self.device.type != "cuda"
        self.on_sync = on_sync
        self.events: list[SyncEvent] = []
        self.frame: int | None = None
        self._host: dict[int, weakref.ref] = {}  # emulation: ids of host tensors
        self._claimed = 0  # >0 while a Python-level sync runs (its ATen ops are not counted again)
        self._paused = 0
        self._modes: tuple | None = None
        self._waits: contextlib.AbstractContextManager | None = None  # `watch_waits` while active

    # ---- device / host ----
    def on_device(self, t: torch.Tensor) -> bool:
        if not self.emulated:
            return t.device.type == "cuda"
        return id(t) not in self._host

    def _mark_host(self, t) -> None:
        if self.emulated and isinstance(t, torch.Tensor):
            key = id(t)
            self._host[key] = weakref.ref(t, lambda _: self._host.pop(key, None))

    def _mark_outputs_host(self, result) -> None:
        if isinstance(result, torch.Tensor):
            self._mark_host(result)
        elif isinstance(result, (list, tuple)):
            for r in result:
                self._mark_host(r)

    def _is_device_target(self, target) -> bool:
        if target is None:
            return False
        if self.emulated:  # the literal "cpu" means the host; the device object (also the CPU) the device
            return not (isinstance(target, str) and target == "cpu")
        return torch.device(target).type == "cuda" if not isinstance(target, int) else True

    # ---- recording ----
    def record(self, op: str) -> None:
        if self._paused:
            return
        site, function, code, origin, setup = locate()
        event = SyncEvent(op, site, function, code, origin, setup, self.frame)
        self.events.append(event)
        if self.on_sync is not None:
            self.on_sync(event)

    def paused(self):
        detector = self

        class _Paused:
            def __enter__(self):
                detector._paused += 1

            def __exit__(self, *exc):
                detector._paused -= 1

        return _Paused()

    def _claim(self, op: str, call: Callable[[], object]):
        self.record(op)
        self._claimed += 1
        try:
            return call()
        finally:
            self._claimed -= 1

    # ---- the Python level ----
    def handle_function(self, func, args, kwargs):
        kwargs = kwargs or {}
        call = lambda: func(*args, **kwargs)  # noqa: E731
        if func in READS or func in HOST_COPIES:
            if args and isinstance(args[0], torch.Tensor) and self.on_device(args[0]):
                result = self._claim(READS.get(func) or HOST_COPIES[func], call)
                if func in HOST_COPIES and self.emulated:
                    result = self._real_copy(args[0], result)
                return result
            result = call()
            self._mark_outputs_host(result)
            return result
        if func in COMPARE_READS:
            if any(self.on_device(t) for t in _tensors(args, kwargs)):
                return self._claim(COMPARE_READS[func], call)
            return call()
        if func is _T.to or func is _T.cuda:
            return self._transfer(func, args, kwargs, call)
        if func in DATA_FACTORIES:
            data = args[0] if args else kwargs.get("data")
            target = kwargs.get("device")
            from_device = isinstance(data, torch.Tensor) and self.on_device(data)
            if self._is_device_target(target) and not from_device:
                result = self._claim("h2d", call)
                if self.emulated and isinstance(data, torch.Tensor) and result is data:
                    result = data.clone()
                    self._host.pop(id(result), None)
                return result
            result = call()
            if target is None and not from_device:
                self._mark_outputs_host(result)
            return result
        if func is _T.__setitem__ and len(args) >= 3 and isinstance(args[0], torch.Tensor) and self.on_device(args[0]):
            return self._setitem(args, call)
        if func is _T.copy_ and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            dst, src = args[0], args[1]
            non_blocking = bool(kwargs.get("non_blocking", False)) or (len(args) > 2 and args[2] is True)
            if self.on_device(dst) != self.on_device(src) and not non_blocking:
                return self._claim("h2d" if self.on_device(dst) else "d2h", call)
            return call()
        tensors = _tensors(args, kwargs)
        result = call()
        if self.emulated:
            if tensors and not any(self.on_device(t) for t in tensors):
                self._mark_outputs_host(result)
            elif not tensors and isinstance(result, torch.Tensor) and not self._is_device_target(kwargs.get("device")):
                self._mark_outputs_host(result)  # a factory without device= (or "cpu"): a host tensor on a GPU too
        return result

    def _transfer(self, func, args, kwargs, call):
        src = args[0]
        if func is _T.cuda:
            target, non_blocking = "cuda", bool(kwargs.get("non_blocking", False))
        else:
            target, non_blocking = _to_target(args, kwargs)
        if target is None:  # dtype only
            result = call()
            if not self.on_device(src):
                self._mark_outputs_host(result)
            return result
        to_device = self._is_device_target(target)
        if self.on_device(src) and not to_device:
            return self._real_copy(src, self._claim("d2h", call))
        if not self.on_device(src) and to_device:
            result = self._claim("h2d", call) if not non_blocking else call()
            if self.emulated and result is src:
                result = src.clone()
                self._host.pop(id(result), None)
            return result
        result = call()
        if not self.on_device(src):
            self._mark_outputs_host(result)
        return result

    def _setitem(self, args, call):
        """`device[index] = value`: a list or host-tensor index is copied to the device; with advanced
        (tensor) indexing a Python scalar value becomes a host tensor that is copied too; a host tensor value
        is copied whatever the index; so is a Python scalar written to a single element (`x[3] = 1`: PyTorch
        copies a 0-dim host tensor there). Basic indexing of several elements with a scalar is a fill."""
        index, value = args[1], args[2]
        parts = index if isinstance(index, tuple) else (index,)
        tensors = [i for i in parts if isinstance(i, torch.Tensor)]
        copies = sum(1 for i in parts if isinstance(i, list)) + sum(1 for t in tensors if not self.on_device(t))
        if isinstance(value, torch.Tensor):
            copies += 0 if self.on_device(value) else 1
        elif tensors or any(isinstance(i, list) for i in parts):
            copies += 1
        elif all(isinstance(i, int) for i in parts) and len(parts) == args[0].dim():
            copies += 1
        for _ in range(copies - 1):
            self.record("h2d")
        return self._claim("h2d", call) if copies else call()

    def _real_copy(self, src, result):
        """Emulation: a host copy is a distinct object (PyTorch returns the same one on the CPU)."""
        if isinstance(result, torch.Tensor):
            if result is src:
                with self.paused():
                    result = src.clone()
            self._mark_host(result)
        return result

    # ---- the ATen level ----
    def handle_aten(self, func, args, kwargs):
        if not self._claimed and not self._paused:
            op = ATEN_SYNCS.get(func)
            if op is None and func in _INDEX_OPS:
                indices = args[1] if len(args) > 1 else ()
                if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
                    op = "mask_index"
            if op is None and func in (_aten._to_copy.default, _aten.copy_.default) and not self.emulated:
                op = self._cuda_copy(func, args, kwargs)
            if op is not None and args and isinstance(args[0], torch.Tensor) and (
                    self.on_device(args[0]) or op in ("h2d", "d2h")):
                self.record(op)
        return func(*args, **(kwargs or {}))

    @staticmethod
    def _cuda_copy(func, args, kwargs) -> str | None:
        kwargs = kwargs or {}
        if kwargs.get("non_blocking"):
            return None
        if func is _aten._to_copy.default:
            src, target = args[0], kwargs.get("device")
            if target is None or torch.device(target).type == src.device.type:
                return None
            return "d2h" if src.is_cuda else "h2d"
        dst, src = args[0], args[1]
        if dst.device.type == src.device.type:
            return None
        return "d2h" if src.is_cuda else "h2d"

    # ---- activation ----
    def __enter__(self) -> SyncDetector:
        detector = self

        class _Function(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return detector.handle_function(func, args, kwargs)

        class _Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return detector.handle_aten(func, args, kwargs)

        self._modes = (_Dispatch(), _Function())
        for mode in self._modes:
            mode.__enter__()
        self._wrap_waits()
        return self

    def __exit__(self, *exc) -> None:
        self._unwrap_waits()
        for mode in reversed(self._modes or ()):
            mode.__exit__(*exc)
        self._modes = None

    # ---- explicit waits (not tensor operations: the modes do not see them) ----
    def _wrap_waits(self) -> None:
        self._waits = watch_waits(self.record)
        self._waits.__enter__()

    def _unwrap_waits(self) -> None:
        if self._waits is not None:
            self._waits.__exit__(None, None, None)
            self._waits = None
