"""The codec's streaming step over a fixed number of row slots, replayed from a CUDA graph on CUDA.

Why: the eager `decode_stream` is launch-bound (hundreds of small kernels per frame): on an H200 its
first frame cost 15-42 ms, most of the time to first audio, and a batched step ~15-20 ms. A graph needs
static shapes and addresses, so a `SlotBatch` keeps a static `DecoderStreamState` of `rows` slots
(a bucket: 1, 2, 4, ...) and a static codes input [rows, 16, 1], and every step decodes one frame for
ALL slots. Rows are independent in the decoder (embedding, convolutions and norms act per row, attention
per row and head, the mask per row), so a slot nobody uses decodes junk that changes no other row.

The captured function, `SlotBatch.advance`, runs `decode_step` (decode_stream as a pure function of the
codes and the state's tensors; decode_stream rebinds a state's tensors to new ones and never writes into
them), then copies the new tensors back into the static ones: each replay advances the state. On the CPU,
or when capture fails (logged, kept in `fallback_reason`), the same function runs without a graph. decode_stream
has no host sync and no value-dependent shape or branch (positions are only used in tensor arithmetic:
streaming.window_mask).

Compiled step (`compile`; the `codec_compile_slots` setting: on CUDA, buckets of 16 slots and more by
default): `decode_step` through
`torch.compile` (Inductor, whole graph, static shapes), so that the eager step's many small element-wise
kernels fuse: SnakeBeta alone is six (exp, mul, sin, pow, div, add), then the residual adds, the contexts'
concatenations, LayerNorm and GELU, a large share of an eager step's kernel time. Inductor's default mode,
not "reduce-overhead": our graph captures the compiled code, which must not capture CUDA graphs of its own.
The convolution forms are tuned eagerly first and compiled in as chosen (`TwoFormConvolution.gemm_shapes` says
why it is a dict). Why only the large buckets by default: there the fused kernels save the most (a 32-slot step
9.2 -> 7.0 ms in FP32, 6.2 -> 3.9 ms with TF32 on an H200; through the worker at 64 clients the codec step
5.80 ms against 9.32 ms uncompiled: docs/performance.md, serve-46ea515-20261203.json and
serve-6f13d35-20261204.json), while
each bucket's compile costs 16-35 s of a cold start (Inductor's cache makes the next start's far shorter), and
the small buckets' steps are short anyway.
A failed compile is logged and kept in `fallback_reason`, and the batch runs (and captures) the
uncompiled step.

Convolution forms (`tune_convolutions`): before capture, each one-group causal convolution and transposed
convolution is timed at this bucket's input shape as the library's (cuDNN, under the capture's flags)
and as one GEMM (model/codec/layers.py `conv1d_as_gemm` over the stacked taps, `conv_transpose1d_as_gemm`
with an overlap-add; true FP32), and the graph captures the faster (which one wins depends on the shape).
The choices are kept per host (`FormStore`, a JSON file beside Inductor's cache) and the next start takes them
without timing again: near a tie the measurement picks differently from one process to the next, and a
compiled step whose forms changed is new code to Inductor, compiled again in full (on an H200, a start with
warm caches compiled its 32- and 64-slot buckets in 21.9 and 25.1 s, their forms having changed, and its
16-slot bucket, whose forms had not, in 4.6 s).

`SlotPool` keeps the built batches of one codec by row count, so a graph captured once (e.g. at the
runtime's warm-up, or by `prepare`) serves every later `CodecRows` (engine/codec_rows.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import types
import weakref
from collections.abc import Callable
from pathlib import Path

import torch

from breeze_worker.engine.fastpath.graph import capture_graph, run_on_side_stream
from breeze_worker.model.codec.layers import TwoFormConvolution
from breeze_worker.model.codec.streaming import DecoderStreamState

log = logging.getLogger(__name__)


def _time_us(fn, device: torch.device, repeats: int) -> float:
    """Mean microseconds of `fn()` after one warm-up call (CUDA events on CUDA, host time elsewhere)."""
    fn()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        return 1000.0 * start.elapsed_time(end) / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1e6 * (time.perf_counter() - t0) / repeats


class FormStore:
    """The convolution forms chosen on this host for one decoder, device and precision: a JSON file
    {"identity": ..., "forms": {"<conv name>|<shape>": true/false}} read once and rewritten (whole, through a
    rename) when a bucket adds choices. Only the choice is kept, never a result: a stored form still runs
    through `tune_convolutions`' output check. An unreadable file counts as empty, an unwritable directory
    costs the next start its timing, nothing else."""

    def __init__(self, path: Path, identity: dict) -> None:
        self.path = path
        self.identity = identity
        self._lock = threading.Lock()
        self._forms: dict[str, bool] = self._read()

    @classmethod
    def for_decoder(cls, decoder, tf32: bool, directory: Path | None = None) -> FormStore:
        """The store of `decoder`'s convolutions on its device with cuDNN's TF32 flag `tf32`, in `directory`
        (default: `forms_directory()`). The identity names what a choice depends on: the GPU, the libraries,
        the precision and every tunable convolution's geometry (not the weights' values)."""
        device = decoder.device
        convs = [[name, type(m).__name__, list(m.conv.weight.shape), list(m.conv.stride), list(m.conv.dilation)]
                 for name, m in decoder.named_modules() if isinstance(m, TwoFormConvolution) and m.gemm_capable]
        identity = {"device": (torch.cuda.get_device_name(device) if device.type == "cuda" else device.type),
                    "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "tf32": bool(tf32),
                    "convolutions": convs}
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        return cls((directory or forms_directory()) / f"codec-forms-{digest}.json", identity)

    @staticmethod
    def _key(name: str, shape) -> str:
        return f"{name}|{','.join(str(int(n)) for n in shape)}"

    def _read(self) -> dict[str, bool]:
        try:
            doc = json.loads(self.path.read_text())
            forms = doc["forms"] if doc.get("identity") == self.identity else {}
            return {str(k): bool(v) for k, v in forms.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("codec convolution forms in %s unreadable (%s); timing them again", self.path, exc)
            return {}

    def get(self, name: str, shape) -> bool | None:
        with self._lock:
            return self._forms.get(self._key(name, shape))

    def put(self, choices: dict[tuple[str, tuple[int, ...]], bool]) -> None:
        """Add `choices` ((conv name, shape) -> GEMM) and rewrite the file (merged with what another process
        may have written meanwhile)."""
        with self._lock:
            self._forms.update({self._key(n, s): bool(g) for (n, s), g in choices.items()})
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                merged = {**self._read(), **self._forms}
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"identity": self.identity, "forms": merged}, indent=1, sort_keys=True))
                os.replace(tmp, self.path)
            except OSError as exc:
                log.warning("could not keep the codec convolution forms in %s (%s): the next start times them "
                            "again", self.path, exc)


def forms_directory() -> Path:
    """Where `FormStore` files live: beside the compiled code they go with, in Inductor's cache directory
    (TORCHINDUCTOR_CACHE_DIR, else Inductor's default), under breeze/; Inductor's own helper says which. The
    helper's module is loaded on its own (it has no torch dependencies, its docstring says): importing it as part
    of torch._inductor imports Dynamo, seconds of a start-up that compiles nothing before serving."""
    try:
        base = Path(_inductor_cache_dir_utils().cache_dir())
    except Exception:  # noqa: BLE001 - a private helper that may move: the temporary directory then
        base = Path(tempfile.gettempdir()) / "torchinductor"
    return base / "breeze"


@functools.cache
def _inductor_cache_dir_utils() -> types.ModuleType:
    """torch/_inductor/runtime/cache_dir_utils.py, loaded without its package (the package once imported: it)."""
    import importlib.util
    import sys

    loaded = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if loaded is not None:
        return loaded
    path = Path(torch.__file__).parent / "_inductor" / "runtime" / "cache_dir_utils.py"
    spec = importlib.util.spec_from_file_location("breeze_worker._inductor_cache_dir_utils", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tune_convolutions(decoder, step, repeats: int = 5, margin: float = 0.95,
                      store: FormStore | None = None) -> list[dict]:
    """For every one-group causal convolution and transposed convolution of `decoder`, at the input shape
    `step()` (one decode step) gives it: time the library's convolution and the GEMM form
    (`conv1d_as_gemm`, `conv_transpose1d_as_gemm`) on random input of that shape, and run
    the shape as a GEMM when that takes less than `margin` x the library's time (the module's
    `gemm_shapes`). A GEMM whose output does not match the library's (relative difference > 1e-2: a bug,
    not rounding) is never chosen. With a `store`, a shape it holds a choice for takes that choice untimed
    (the output check still runs), and the new choices go into it. Returns per convolution: name, input
    shape, both times (us; None where stored), the choice, whether it was stored, the relative difference."""
    names = {m: name for name, m in decoder.named_modules()
             if isinstance(m, TwoFormConvolution) and m.gemm_capable}
    shapes: dict = {}

    def record(module, _inputs, output):
        shapes.setdefault(module, module.input_shape(output))

    report = []
    chosen: dict[tuple[str, tuple[int, ...]], bool] = {}
    with torch.no_grad():
        hooks = [m.register_forward_hook(record) for m in names]
        try:
            step()
        finally:
            for hook in hooks:
                hook.remove()
        for module, shape in shapes.items():
            name, shape = names[module], tuple(int(n) for n in shape)
            weight = module.conv.weight
            generator = torch.Generator(device=weight.device).manual_seed(0)
            x = torch.randn(shape, generator=generator, device=weight.device, dtype=weight.dtype)
            library = module.convolve(x, gemm=False)
            gemm = module.convolve(x, gemm=True)
            diff = float((library - gemm).abs().max() / library.abs().max().clamp_min(1e-30))
            stored = store.get(name, shape) if store is not None else None
            library_us: float | None = None
            gemm_us: float | None = None
            if stored is None:
                library_us = _time_us(functools.partial(module.convolve, x, gemm=False), weight.device, repeats)
                gemm_us = _time_us(functools.partial(module.convolve, x, gemm=True), weight.device, repeats)
                faster = gemm_us < margin * library_us
                chosen[(name, shape)] = faster
            else:
                faster = stored
            use = faster and diff <= 1e-2
            module.set_form(shape, use)
            report.append({"conv": name, "shape": list(shape), "library_us": library_us, "gemm_us": gemm_us,
                           "gemm": use, "stored": stored is not None, "relative_diff": diff})
    if store is not None and chosen:
        store.put(chosen)
    return report


def clear_convolution_forms(decoder) -> None:
    """Every convolution of `decoder` back to the library's form at every shape."""
    for module in decoder.modules():
        if isinstance(module, TwoFormConvolution):
            module.gemm_shapes = {}


def decode_step(decoder, codes: torch.Tensor, contexts: list[torch.Tensor], keys: list[torch.Tensor],
                values: list[torch.Tensor], position: torch.Tensor) -> tuple:
    """One `decode_stream` call as a function of tensors only: (codes, the state's tensors) -> (audio, the new
    state's contexts, keys, values, position); the given tensors are left as they are. Without a state object
    among its inputs Dynamo traces it whole and guards on the tensors and the decoder alone."""
    state = DecoderStreamState(list(contexts), list(keys), list(values), position)
    audio = decoder.decode_stream(codes, state)
    return audio, state.contexts, state.keys, state.values, state.position


def compile_step(backend: str | Callable = "inductor") -> Callable:
    """`decode_step` through `torch.compile` (whole graph, static shapes), with a code object of its own.

    Dynamo keeps its compiled entries on the code object: batches compiling the same function would share
    one cache, one entry per bucket, and the ninth bucket (1..256) would pass `recompile_limit` (8), which
    makes a whole-graph compile fail (without `fullgraph`, Dynamo would run the step eagerly, saying so only
    in a warning). One code object per batch keeps one entry each, with no process-wide change to Dynamo's
    limits (which torch 2.13 keeps per thread: a limit raised on one thread does not hold on another)."""
    code = decode_step.__code__.replace()  # an equal code object, not the same one
    fn = types.FunctionType(code, decode_step.__globals__, decode_step.__name__)
    mode = "default" if backend == "inductor" else None  # no Inductor CUDA graphs: ours capture it
    return torch.compile(fn, backend=backend, fullgraph=True, dynamic=False, mode=mode)


def bucket_for(rows: int) -> int:
    """The smallest power of two >= rows (the slot counts graphs are captured for)."""
    return 1 << max(0, rows - 1).bit_length()


class SlotBatch:
    """A static streaming state of `rows` slots, its codes input, and the step decoding all slots at once."""

    def __init__(self, decoder, rows: int, use_graphs: bool | None = None, *, benchmark: bool = True,
                 tf32: bool | None = None, tune: bool = True, keep_forms: bool = True, compile: bool = False,
                 compile_backend: str | Callable = "inductor"):
        """`benchmark`: cuDNN benchmark mode for the warm-up and capture; `tf32`: TF32 convolutions in the
        captured graph (None: the process's `torch.backends.cudnn.allow_tf32`, which the runtime sets from
        the `codec_tf32` setting, engine/runtime.py `configure_codec_convolutions`); `tune`: choose each
        convolution's form by measurement before capture (`tune_convolutions`; `conv_tuning` keeps the
        report); `keep_forms`: take and keep the choices in this host's `FormStore`. These four matter on
        CUDA only. `compile`: the step through `torch.compile`, here, before any capture (the
        `codec_compile_slots` setting, through `SlotPool`; `compiled` says whether it is, `compile_s` how long
        compiling took, apart from `capture_s`); `compile_backend`: torch.compile's backend (the CPU tests
        trace with "aot_eager", which generates no code)."""
        self.decoder = decoder
        self.rows = rows
        self.benchmark = benchmark
        self.tf32 = tf32
        self.tune = tune
        self.keep_forms = keep_forms
        self.compile = compile
        self.compile_backend = compile_backend
        self.conv_tuning: list[dict] = []
        self.device = decoder.device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.audio: torch.Tensor | None = None  # the graph's output [rows, 1920], rewritten by each replay
        self.fallback_reason: str | None = None
        self.capture_s = 0.0
        self.compile_s = 0.0
        self._decode: Callable = decode_step  # the compiled step once `_compile` succeeds
        with torch.inference_mode():
            self.state = decoder.new_stream(rows)
            self.codes = torch.zeros(rows, decoder.config.num_quantizers, 1, dtype=torch.long, device=self.device)
        if self.use_graphs:
            self._capture()  # tunes, compiles, captures
        elif self.compile:
            self._compile()
        if self.device.type == "cuda":  # the zero-fills above ran on this thread's stream; the batch may be
            # used on another one (engine/codec_rows.py's codec stream). This stream only: a device-wide
            # synchronize fails while another thread captures a graph (a batch built on demand while serving)
            torch.cuda.current_stream(self.device).synchronize()

    @property
    def graphed(self) -> bool:
        return self.graph is not None

    @property
    def compiled(self) -> bool:
        return self._decode is not decode_step

    def advance(self) -> torch.Tensor:
        """Decode `self.codes` for every slot and write the new state into the static tensors -> [rows, 1920].
        This is what the graph captures; eagerly it is the whole step."""
        state = self.state
        audio, *new = self._decode(self.decoder, self.codes, state.contexts, state.keys, state.values,
                                   state.position)
        state.copy_(DecoderStreamState(*new))
        return audio

    def step(self, host_codes: torch.Tensor) -> torch.Tensor:
        """int64 [rows, 16] on the host (pinned on CUDA) -> audio [rows, 1920] on the device, no host sync.
        The caller reads the audio (the step's one host read) before the next step."""
        with torch.inference_mode():
            self.codes.copy_(host_codes.unsqueeze(-1), non_blocking=True)
            if self.graph is not None:
                self.graph.replay()
                assert self.audio is not None  # captured together with the graph
                return self.audio
            return self.advance()

    def new_host_codes(self) -> torch.Tensor:
        """A zeroed host buffer for one step's codes (pinned on CUDA, so the upload does not wait); idle
        slots keep code 0, a valid code."""
        return torch.zeros(self.rows, self.codes.shape[1], dtype=torch.long, pin_memory=self.device.type == "cuda")

    def clear(self) -> None:
        with torch.inference_mode():
            self.state.zero_rows_(slice(None))
            self.codes.zero_()

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason if self.fallback_reason is None else f"{self.fallback_reason}; {reason}"
        log.warning("%s", reason)

    def _compile(self) -> None:
        """Compile the step now (the first call compiles), so that a bucket's compile happens while it is
        prepared and never during a replay or a serving step. The call leaves the state as it is: the
        step is pure, and its result is not copied back."""
        t0 = time.perf_counter()
        try:
            step = compile_step(self.compile_backend)
            state = self.state
            with torch.inference_mode():
                step(self.decoder, self.codes, state.contexts, state.keys, state.values, state.position)
            self._decode = step
        except Exception as exc:  # compiling is an optimization: the uncompiled step does the same
            log.debug("the codec step's compile failed", exc_info=exc)
            self._fall_back(f"torch.compile of the codec step failed ({type(exc).__name__}: "
                            f"{str(exc).strip()[:1000]}); running {self.rows} slots uncompiled")
        self.compile_s = time.perf_counter() - t0
        if self.compiled:
            log.info("compiled the codec step for %d slots in %.1f s", self.rows, self.compile_s)

    def _capture(self) -> None:
        t0 = time.perf_counter()
        try:
            # cuDNN benchmark mode for the warm-up and capture only: its heuristic choice for the codec's
            # transposed convolutions can be a far slower kernel; benchmarking once per bucket picks the
            # fastest algorithm for these fixed shapes, and the captured graph keeps it. Other precision
            # flags stay as they are.
            cudnn = torch.backends.cudnn
            tf32 = cudnn.allow_tf32 if self.tf32 is None else self.tf32
            with torch.inference_mode(), cudnn.flags(enabled=cudnn.enabled, benchmark=self.benchmark,
                                                     deterministic=cudnn.deterministic, allow_tf32=tf32):
                if self.tune:  # eagerly, before compiling: the compiled step takes the forms chosen here
                    store = FormStore.for_decoder(self.decoder, tf32) if self.keep_forms else None
                    self.conv_tuning = tune_convolutions(self.decoder, self.advance, store=store)
                if self.compile:
                    self._compile()
                # warm-up: cuDNN/cuBLAS choose and allocate outside the capture
                run_on_side_stream(self.device, lambda: [self.advance() for _ in range(2)])
                # thread-local: CUDA work of other threads (the engine thread's steps, a reference being
                # encoded) goes on meanwhile; no device sync or cache emptying first (fastpath/graph.py)
                stream = torch.cuda.Stream(self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                graph, audio = capture_graph(self.advance, stream)
                stream.synchronize()
            self.graph, self.audio = graph, audio
        except Exception as exc:  # graphs are an optimization: the same step runs eagerly
            self.graph = self.audio = None
            self.use_graphs = False
            self._fall_back(f"CUDA graph capture of the codec step failed ({type(exc).__name__}: {exc}); "
                            f"decoding {self.rows} slots eagerly")
        self.clear()  # the warm-up steps advanced the state
        self.capture_s = time.perf_counter() - t0 - self.compile_s
        if self.graph is not None:
            gemm = [c for c in self.conv_tuning if c["gemm"]]
            stored = sum(c["stored"] for c in self.conv_tuning)
            log.info("captured the codec step for %d slots in %.2f s (%d of %d convolutions as GEMMs, %d forms "
                     "kept from an earlier start, %d timed now; %s)", self.rows, self.capture_s, len(gemm),
                     len(self.conv_tuning), stored, len(self.conv_tuning) - stored,
                     f"compiled in {self.compile_s:.1f} s" if self.compiled else "not compiled")


class SlotPool:
    """Built `SlotBatch`es of one codec decoder, free ones by row count; `acquire` builds (and captures)
    one when none is free. Thread-safe. `compile_from`: the batches it builds of at least this many rows are
    compiled (0: none; the `codec_compile_slots` setting the runtime was started with)."""

    def __init__(self, decoder, compile_from: int = 0):
        self.decoder = decoder
        self.device = decoder.device
        self.compile_from = compile_from
        self._free: dict[int, list[SlotBatch]] = {}
        self._lock = threading.RLock()  # a CodecRows finalizer may release from inside a locked allocation
        self.built: set[int] = set()  # row counts built at least once (held or free)

    def acquire(self, rows: int) -> SlotBatch:
        with self._lock:
            free = self._free.get(rows)
            if free:
                return free.pop()
        # outside the lock: capture runs gc, which may release
        batch = SlotBatch(self.decoder, rows, compile=self.compiles(rows))
        self.built.add(rows)
        return batch

    def ensure(self, rows: int) -> float:
        """Build a batch of `rows` rows unless one was built already (held or free); seconds. The start-up
        thread builds the buckets a growing number of streams needs this way while the engine holds one."""
        if rows in self.built:
            return 0.0
        t0 = time.perf_counter()
        self.release(self.acquire(rows))
        return time.perf_counter() - t0

    def compiles(self, rows: int) -> bool:
        """Whether a batch of `rows` rows is built compiled."""
        return 0 < self.compile_from <= rows

    def release(self, batch: SlotBatch) -> None:
        with self._lock:
            self._free.setdefault(batch.rows, []).append(batch)

    def prepare(self, max_rows: int) -> float:
        """Build (compile, capture) one batch of every bucket up to `max_rows` now, so serving never
        captures; seconds."""
        t0 = time.perf_counter()
        rows = 1
        while rows <= bucket_for(max_rows):
            self.release(self.acquire(rows))
            rows *= 2
        return time.perf_counter() - t0


_POOLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # codec -> SlotPool (holds the decoder only)
_POOLS_LOCK = threading.Lock()


def pool_for(codec, compile_from: int | None = None) -> SlotPool:
    """The pool of `codec` (a new one if the codec moved to another device, or if `compile_from` is given and
    is not the pool's: its batches were built the other way). `compile_from` None: the pool as it is (a new
    pool: none compiled)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(codec)
        if (pool is None or pool.decoder is not codec.decoder or pool.device != codec.device
                or (compile_from is not None and pool.compile_from != compile_from)):
            pool = _POOLS[codec] = SlotPool(codec.decoder, compile_from=compile_from or 0)
        return pool
