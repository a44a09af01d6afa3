"""Run one benchmark variant (decode path x CFG) on a loaded model and measure it.

End of speech is masked (its logit set to a large finite negative, so CFG stays finite) for both paths,
so every request runs exactly `frames` frames and the paths do the same work.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from dataclasses import dataclass, field

import torch

from breeze_worker.config import FastPathSettings
from breeze_worker.engine import tracing
from breeze_worker.engine.codec_rows import CodecRows
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import SynthesisRequest
from breeze_worker.measure.instruments import SyncCounter, gpu_busy_fraction, now, peak_memory_bytes, reset_peak_memory
from breeze_worker.model.loaded import FRAME_RATE_HZ, LoadedModel

log = logging.getLogger(__name__)

SENTENCE = "The quick brown fox jumps over the lazy dog, and the weather today is bright and clear."
INSTRUCTION = "Speak clearly and naturally."


def mask_end_of_speech(model: LoadedModel) -> None:
    """Make end of speech unreachable: its backbone logit becomes float32.min / 4 (finite)."""
    lm = model.lm
    if getattr(lm, "_bench_eos_masked", False):
        return
    original = lm.backbone_logits
    eos = model.config.end_of_speech_id
    low = torch.finfo(torch.float32).min / 4

    def masked(hidden: torch.Tensor) -> torch.Tensor:
        logits = original(hidden)
        return torch.cat((logits[..., :eos], torch.full_like(logits[..., eos:eos + 1], low), logits[..., eos + 1:]),
                         dim=-1)

    lm.backbone_logits = masked  # type: ignore[method-assign]  # this one instance's logits, patched
    lm._bench_eos_masked = True  # type: ignore[assignment]  # nn.Module.__setattr__ is typed for tensors/modules


def make_request(model: LoadedModel, cfg: bool, frames: int, seed: int, text: str = SENTENCE):
    req = SynthesisRequest(text=text, instruction=INSTRUCTION if cfg else None,
                           cfg_scale=(2.0 if cfg else None), seed=seed, max_frames=frames)
    return resolve_request(req, model.generation_defaults, None, tokenizer=model.tokenizer)


FAST_PATHS = {"fast": None, "fast-uncompiled": "off", "fast-compiled": "on"}  # path -> compile (None: the settings')


def fast_settings(path: str, settings: FastPathSettings | None = None) -> FastPathSettings:
    """The fast path's settings for a bench `path`: `settings` (None: the defaults) with what the path names:
    a FAST_PATHS name's compile choice, optionally `:FORM` (the compiled layers' form, fastpath/forms.py;
    empty: the settings') and `:SAMPLER` (kernel or torch: who draws the codes), e.g. `fast-compiled::torch`."""
    base, _, rest = path.partition(":")
    form, _, sampler = rest.partition(":")
    settings = settings or FastPathSettings()
    changes = {"compile": FAST_PATHS[base], "form": form, "sampler": sampler}
    return settings.with_changes(**{k: v for k, v in changes.items() if v})


def open_generator(path: str, model: LoadedModel, request, device: torch.device,
                   settings: FastPathSettings | None = None):
    """`path`: eager, or a fast path (`fast_settings`) run with `settings` and what the path names."""
    if path.partition(":")[0] in FAST_PATHS:
        from breeze_worker.engine.fastpath.generator import FastFrameGenerator

        return FastFrameGenerator(model, request, device, settings=fast_settings(path, settings), timed_stages=True)
    from breeze_worker.engine.eager import EagerFrameGenerator

    return EagerFrameGenerator(model, request, device)


@dataclass
class RunResult:
    frames: list[torch.Tensor]
    wall_s: float
    ttfa_s: float
    stages: dict
    frame_times_s: list[float] = field(default_factory=list)
    syncs_per_frame: float | None = None  # language model + codec
    syncs_lm_per_frame: float | None = None  # asking the generator for a frame
    syncs_codec_per_frame: float | None = None  # decoding it (codes to the codec's device, audio to the host)
    sync_source: str | None = None
    host_reads_per_frame: float | None = None
    warmup_s: float | None = None
    fallback_reason: str | None = None
    compiled: bool | None = None
    compile_fallback_reason: str | None = None
    ttfa_lm_s: float = 0.0
    ttfa_codec_s: float | None = None


def _decode(rows, frame: torch.Tensor) -> None:
    """The engine's codec step (engine/codec_rows.py: a CUDA graph replay on CUDA) for the one stream."""
    with tracing.span("codec_decode"):
        rows.decode({0: frame})


def run_once(path: str, model: LoadedModel, request, device: torch.device, count_syncs: bool = False,
             on_sync=None, settings: FastPathSettings | None = None) -> RunResult:
    """One request: frames, wall time, time to first audio (first frame decoded by the codec when there is
    one), stage split, per-frame times. With `count_syncs`, host syncs per frame after the first, split into
    the language model's and the codec's (instruments.SyncCounter: slows the run down on the CPU, so not a timed
    run); `on_sync(event)` sees each of them (trace marks)."""
    codec = model.codec
    rows = None
    if codec is not None:  # the first request of a run captures the codec's graph (the pool keeps it)
        rows = CodecRows(codec)
        rows.add(0)
    counter = SyncCounter(device, on_sync=on_sync)
    scope = contextlib.ExitStack()
    if count_syncs:  # the whole request is watched (every sync reaches `on_sync`); only frames 2.. are counted
        scope.enter_context(counter.counting())
    try:
        with scope:
            return _run(path, model, request, device, codec, rows, counter, count_syncs, settings)
    finally:
        if rows is not None:
            rows.remove(0)


def _run(path: str, model: LoadedModel, request, device: torch.device, codec, rows, counter: SyncCounter,
         count_syncs: bool, settings: FastPathSettings | None) -> RunResult:
    codec_s = lm_wait_s = 0.0
    frames, frame_times = [], []
    t0 = now(device)
    gen = open_generator(path, model, request, device, settings)
    it = iter(gen)
    first = next(it)
    ttfa_lm = time.perf_counter() - t0
    frames.append(first)
    if codec is not None:
        c0 = time.perf_counter()
        _decode(rows, first)
        codec_s += time.perf_counter() - c0
    ttfa = time.perf_counter() - t0
    last = time.perf_counter()
    while True:
        with counter.section("lm"):
            frame = next(it, None)
        if frame is None:
            break
        if not count_syncs and device.type == "cuda":
            # the fast path queues the next frame's backbone step before it hands this frame out: wait for
            # it here, or the codec's decode below (same stream) would absorb the backbone's time
            w0 = time.perf_counter()
            torch.cuda.synchronize(device)
            lm_wait_s += time.perf_counter() - w0
        frames.append(frame)
        t = time.perf_counter()
        frame_times.append(t - last)
        if codec is not None:
            with counter.section("codec"):
                _decode(rows, frame)
            codec_s += time.perf_counter() - t
        last = time.perf_counter()
    wall = now(device) - t0
    stages = dict(gen.timings)
    stages["generate_s"] = stages.get("generate_s", 0.0) + lm_wait_s  # the backbone steps waited out above
    stages["codec_s"] = codec_s if codec is not None else None
    counted = len(frames) - 1  # frames after the first (the first carries the request's setup)

    def per_frame(section: str) -> float | None:
        if not count_syncs or counted < 1 or (section == "codec" and codec is None):
            return None
        return counter.counts.get(section, 0) / counted

    lm, codec_syncs = per_frame("lm"), per_frame("codec")
    return RunResult(
        frames=frames, wall_s=wall, ttfa_s=ttfa, stages=stages, frame_times_s=frame_times,
        syncs_per_frame=None if lm is None else lm + (codec_syncs or 0.0),
        syncs_lm_per_frame=lm, syncs_codec_per_frame=codec_syncs,
        sync_source=counter.source if count_syncs else None,
        host_reads_per_frame=(gen.host_reads / len(frames)) if hasattr(gen, "host_reads") else None,
        fallback_reason=getattr(gen, "fallback_reason", None), compiled=getattr(gen, "compiled", None),
        compile_fallback_reason=getattr(gen, "compile_fallback_reason", None),
        ttfa_lm_s=ttfa_lm, ttfa_codec_s=(ttfa - ttfa_lm) if codec is not None else None,
    )


def time_variant(name: str, path: str, cfg: bool, model: LoadedModel, device: torch.device, *, frames: int,
                 repeats: int, seed: int, tracer: tracing.Tracer | None = None,
                 settings: FastPathSettings | None = None) -> dict:
    """Warm up once and time `repeats` requests: one JSON-able dict (`instrument_variant` adds the host-sync
    count and the GPU-busy profile). With `tracer`, the first timed request is traced (spans only)."""
    request = make_request(model, cfg, frames, seed)
    warm_t0 = time.perf_counter()
    warm = run_once(path, model, request, device, settings=settings)  # first use: graph capture for the fast path
    warmup_s = time.perf_counter() - warm_t0
    reset_peak_memory(device)
    from breeze_worker.measure.memory import PeakMemory  # reserved GPU memory and host peak RSS too

    runs = []
    with PeakMemory(device) as peaks:
        for i in range(repeats):
            if tracer is not None and i == 0:
                with tracer.recording(), tracing.span("request", variant=name, path=path, cfg=cfg, timed=True,
                                                      frames=frames):
                    runs.append(run_once(path, model, request, device, settings=settings))
            else:
                runs.append(run_once(path, model, request, device, settings=settings))
    peak = peak_memory_bytes(device)
    best = min(runs, key=lambda r: r.wall_s)
    per_frame = [statistics.median(r.frame_times_s) for r in runs if r.frame_times_s]
    ms_per_frame = 1000 * statistics.median(per_frame) if per_frame else None
    gen_per_frame = [r.stages["generate_s"] / len(r.frames) for r in runs]
    audio_s = len(best.frames) / FRAME_RATE_HZ
    codec_ttfa = [r.ttfa_codec_s for r in runs if r.ttfa_codec_s is not None]  # None: a run without the codec
    stages = {k: (None if v is None else statistics.median(r.stages[k] for r in runs))
              for k, v in best.stages.items()}
    return {
        "name": name, "path": path, "cfg": cfg, "cfg_scale": request.cfg_scale, "frames": len(best.frames),
        "repeats": repeats,
        "ms_per_frame": ms_per_frame,  # median inter-frame time (frame 2 onwards), codec excluded
        "generate_ms_per_frame": 1000 * statistics.median(gen_per_frame),
        "wall_s": statistics.median(r.wall_s for r in runs),
        "rtf": statistics.median(r.wall_s for r in runs) / audio_s,
        "rtf_generate": (ms_per_frame / 1000 * FRAME_RATE_HZ) if ms_per_frame else None,
        "ttfa_ms": 1000 * statistics.median(r.ttfa_s for r in runs),
        "ttfa_lm_ms": 1000 * statistics.median(r.ttfa_lm_s for r in runs),  # text encode + prefill + frame 1
        "ttfa_codec_ms": (None if best.ttfa_codec_s is None
                          else 1000 * statistics.median(codec_ttfa)),  # frame 1 decoded
        "codec_ms_per_frame": (None if best.stages.get("codec_s") is None
                               else 1000 * statistics.median(r.stages["codec_s"] / len(r.frames) for r in runs)),
        "stages_s": stages,
        "peak_memory_bytes": peak,
        **peaks.result,  # gpu_peak_allocated_bytes, gpu_peak_reserved_bytes, host_peak_rss_bytes, host_peak_scope
        "host_reads_per_frame": best.host_reads_per_frame,
        "first_use_s": warmup_s,  # includes graph capture for the fast path
        "fallback_reason": warm.fallback_reason,
        "compiled": warm.compiled,
        "compile_fallback_reason": warm.compile_fallback_reason,
        "codes_digest": int(sum(int(f.sum()) * (i + 1) for i, f in enumerate(best.frames)) % (2**31)),
        "_frames": best.frames,
    }


def instrument_variant(name: str, path: str, cfg: bool, model: LoadedModel, device: torch.device, *, frames: int,
                       seed: int, profile_frames: int = 8, tracer: tracing.Tracer | None = None,
                       warm_up: bool = False, settings: FastPathSettings | None = None) -> dict:
    """The instrumented requests of a variant, each of min(profile_frames, frames) frames: host syncs per frame
    (CUDA's sync debug mode and the explicit waits), then the GPU-busy fraction and kernels under
    torch.profiler. Call it after every timed request of the process: once torch.profiler has run, CUPTI stays
    attached and slows every later frame of the process (the fast path's by ~7% on an H200).
    With `tracer`, the sync-count request is traced with a gpu_sync mark at every sync it counts. `warm_up`: the
    model was loaded again for this pass, so one uncounted request first (its runner's first use)."""
    short = make_request(model, cfg, min(profile_frames, frames), seed)
    if warm_up:
        run_once(path, model, short, device, settings=settings)
    if tracer is not None:
        marks = lambda e: tracing.mark("gpu_sync", op=e.op, site=e.site, code=e.code)  # noqa: E731
        with tracer.recording(), tracing.span("request", variant=name, path=path, cfg=cfg, timed=False,
                                              purpose="host sync count", frames=short.max_frames):
            counted = run_once(path, model, short, device, count_syncs=True, on_sync=marks, settings=settings)
    else:
        counted = run_once(path, model, short, device, count_syncs=True, settings=settings)
    busy = gpu_busy_fraction(device, lambda: run_once(path, model, short, device, settings=settings))
    return {
        # host syncs per frame after the first, from one untimed request of `profiled_frames` frames
        "host_syncs_per_frame": counted.syncs_per_frame,
        "host_syncs_per_frame_lm": counted.syncs_lm_per_frame,
        "host_syncs_per_frame_codec": counted.syncs_codec_per_frame,
        "host_syncs_source": counted.sync_source,
        "gpu_busy_fraction": busy["busy_fraction"],
        "gpu_kernel_s_profiled": busy["kernel_s"],
        "profiled_frames": short.max_frames,  # one request (prompt, frames, codec) under the profiler
        "gpu_kernels_profiled": busy["kernels"],
        "top_kernels": busy["top_kernels"],
    }


def frames_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict:
    n = min(len(a), len(b))
    mismatched = [i for i in range(n) if not torch.equal(a[i], b[i])]
    return {"compared_frames": n, "equal": len(a) == len(b) and not mismatched,
            "first_mismatch": mismatched[0] if mismatched else None}
