"""Concurrency sweep of the batched engine: N streams at once, half of them with CFG.

For each N, N requests arrive together (a burst: the hardest case for time to first audio) and run
through the engine's own machinery, the `BatchedStepper` (one batched frame step per engine step) and
`CodecRows` (one batched codec call per step), with end of speech masked so each runs `frames` frames.
Measured per N: aggregate real-time factor (audio seconds per wall second, higher is better), per-stream
RTF (wall / audio, lower is better) and TTFA (arrival -> first decoded audio, p50 / p95), engine step time
and peak GPU memory. Each step's time is split into the language model's part (the batched frame step:
sample, host read, next backbone step) and the codec's, timed with CUDA events so that neither adds a
host sync; each N is also run once without the codec (`lm_only_step_ms_p50`, the figure comparable with
the batch-1 fast path's ms per frame). The codec call of a step overlaps the next step's language model
as in the engine when its `codec_overlap` setting is on (engine/scheduler.py); `compare_overlap` runs
each burst the other way round too (`other_overlap`), in the same process and on the same stepper.
`agreement` compares each stream's frames batched with the same stream alone, with the joiners' prompts
prefilled together (the CUDA default) or one by one.
"""

from __future__ import annotations

import faulthandler
import logging
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.batching import BatchedStepper, bucket_shapes, pick_shape
from breeze_worker.engine.codec_rows import CodecRows
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import ReferenceInput, ResolvedReference, SynthesisRequest
from breeze_worker.measure.instruments import peak_memory_bytes, reset_peak_memory, synchronize
from breeze_worker.measure.runner import INSTRUCTION
from breeze_worker.model.loaded import FRAME_RATE_HZ, LoadedModel

log = logging.getLogger(__name__)

TEXTS = ("The quick brown fox jumps over the lazy dog.",
         "Streaming speech for many callers at once, one frame per step.",
         "Short line.",
         "A somewhat longer sentence, so that prompts differ in length across the batch of streams.")
TARGETS = {"aggregate_x_at_32": 150.0, "stream_rtf_max": 0.5, "ttfa_p95_ms": 300.0}


@dataclass(frozen=True)
class StreamMix:
    """What the streams of a burst ask for beyond the defaults: one `text` for all (None: `TEXTS` in turn), and
    every `clone_every`-th stream (0: none) cloning `reference` (an encoded reference, `ReferenceStore.intake`).
    The serve bench passes its client mix here, so that the engine and gRPC figures are of the same prompts."""

    text: str | None = None
    clone_every: int = 0
    reference: ResolvedReference | None = None

    def __post_init__(self) -> None:
        if self.clone_every and self.reference is None:
            raise ValueError("a mix that clones needs an encoded reference")

    def clones(self, i: int) -> bool:
        return bool(self.clone_every) and i % self.clone_every == 0


def stream_requests(model: LoadedModel, n: int, frames: int, seed: int, mix: StreamMix | None = None) -> list:
    """n requests, even-numbered with CFG (so 1 stream = CFG, and half of any even N); with a `mix` that
    clones, every clone_every-th from stream 0 (CFG ones for an even clone_every, as the client bench's
    clone requests are)."""
    mix = mix or StreamMix()
    out = []
    for i in range(n):
        cfg = i % 2 == 0
        reference = mix.reference if mix.clones(i) else None
        req = SynthesisRequest(text=mix.text or TEXTS[i % len(TEXTS)], instruction=INSTRUCTION if cfg else None,
                               cfg_scale=2.0 if cfg else None, seed=seed + i, max_frames=frames,
                               reference=(ReferenceInput(reference_id=reference.reference_id)
                                          if reference is not None else None))
        out.append(resolve_request(req, model.generation_defaults, reference, tokenizer=model.tokenizer))
    return out


def burst_need(n: int) -> tuple[int, int]:
    """(streams, rows) a burst of n streams covers: half of them (rounded up) use CFG, two rows each."""
    return n, n + (n + 1) // 2


def sweep_shapes(max_streams: int, levels: list[int], agreement_streams: int = 0) -> list[tuple[int, int]]:
    """The buckets of `bucket_shapes(max_streams)` that this bench's bursts land in (N streams, half of them
    with CFG, join together into rows 0 .. N + ceil(N/2) - 1; a stream alone takes (1, 2)): building only
    these saves start-up time and changes no step's shape."""
    shapes = bucket_shapes(max_streams)
    needs = {(1, 2)} | {burst_need(n) for n in list(levels) + [agreement_streams] if n > 0}
    return sorted({shape for s, r in needs if (shape := pick_shape(shapes, s, r)) is not None})


class _StepClock:
    """Marks within a step: CUDA events on CUDA (no host sync; read after the burst), else host time."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.steps: list[tuple] = []

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(self, *marks) -> None:
        self.steps.append(marks)

    def spans_ms(self, i: int, j: int) -> list[float]:
        """Milliseconds from mark i to mark j of every step (after the device finished)."""
        if self.cuda:
            torch.cuda.synchronize()
            return [m[i].elapsed_time(m[j]) for m in self.steps]
        return [1000 * (m[j] - m[i]) for m in self.steps]


def run_burst(stepper: BatchedStepper, codec, requests: list, device: torch.device,
              overlap: bool = False, stall_dump_s: float | None = None) -> dict:
    """All requests join at once; step until all ended, in the engine's order (engine/scheduler.py): a
    step's codec call is launched after its frames are read and its audio is read during the next step
    (`overlap`: the worker's `codec_overlap` setting, the codec on its own CUDA stream). Returns
    frames per stream and timings: per step the host wall time (`step_times_s`), the language model's
    part (`lm_ms`: CUDA events around the stepper's work on its stream) and the codec's
    (`codec_ms`: events on the codec's own stream). `stall_dump_s`: a step (or the join) still running after
    that many seconds dumps every thread's stack to stderr (faulthandler), to say where a stall sits."""
    rows = CodecRows(codec, overlap=overlap) if codec is not None else None
    keys = list(range(len(requests)))
    # the stepper hands the keys (ints here) back typed as `object`
    frames: dict[object, list] = {k: [] for k in keys}
    first_audio: dict[object, float] = {}
    done: dict[object, float] = {}
    step_times, codec_ms = [], []
    clock = _StepClock(device)
    in_flight: list = []  # [(PendingAudio, keys whose last frame it holds)], at most one

    def deliver() -> None:
        if not in_flight:
            return
        assert rows is not None  # audio is in flight only through the codec rows
        audio, ending = in_flight.pop()
        audio.wait()  # the codec step's one host read
        now = time.perf_counter()
        codec_ms.append(audio.device_ms())
        for k in audio.keys:
            first_audio.setdefault(k, now)
        for k in ending:
            done[k] = now
        rows.remove_all(ending)

    def watch() -> None:
        if stall_dump_s:
            faulthandler.dump_traceback_later(stall_dump_s, file=sys.stderr)

    synchronize(device)
    t0 = time.perf_counter()
    try:
        watch()
        errors = stepper.join(list(zip(keys, requests)))
        join_s = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"join failed: {errors}")
        if rows is not None:
            rows.add_all(keys)
        while len(done) < len(keys):
            watch()
            s0 = time.perf_counter()
            m0 = clock.mark()
            outcomes = stepper.step(while_running=deliver)
            m1 = clock.mark()  # the next backbone step is queued: on CUDA this event closes the LM part
            deliver()  # a no-op if the stepper called it
            emitted, ending = {}, []
            for k, out in outcomes.items():
                if out.error is not None:
                    raise out.error
                if out.frame is not None:
                    frames[k].append(out.frame)
                    emitted[k] = out.frame
                    if out.end_reason is not None:
                        ending.append(k)
                elif out.end_reason is not None:  # ended without a frame: leaves the codec batch now
                    done[k] = time.perf_counter()
                    if rows is not None:
                        rows.remove(k)
            if rows is None:
                synchronize(device)
                now = time.perf_counter()
                for k in emitted:
                    first_audio.setdefault(k, now)
                for k in ending:
                    done[k] = now
            elif emitted:
                in_flight.append((rows.launch(emitted, timed=True), ending))
                if len(done) + len(ending) == len(keys):  # nothing left to overlap with
                    deliver()
            clock.add(m0, m1)
            step_times.append(time.perf_counter() - s0)
    finally:
        if stall_dump_s:
            faulthandler.cancel_dump_traceback_later()
    wall = max(done.values()) - t0
    return {"frames": frames, "t0": t0, "first_audio": first_audio, "done": done, "wall_s": wall, "join_s": join_s,
            "step_times_s": step_times, "lm_ms": clock.spans_ms(0, 1), "codec_ms": codec_ms, "overlap": overlap}


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure_concurrency(model: LoadedModel, device: torch.device, concurrency: list[int], *, frames: int,
                        seed: int, stepper: BatchedStepper | None = None, lm_only: bool = True,
                        compare_overlap: bool = False, on_row=None, stall_dump_s: float | None = None,
                        settings: FastPathSettings | None = None, codec_overlap: bool = False,
                        mix: StreamMix | None = None) -> list[dict]:
    """One row per N (see the module doc). `lm_only`: also time N streams without the codec.
    `stall_dump_s`: see `run_burst`. `codec_overlap`: the worker's setting, how each burst runs its codec;
    `compare_overlap`: also run each burst with the codec overlap the other way round (`other_overlap`).
    `on_row(rows)` is called after each N (the command rewrites its JSON, so a run cut short keeps what it
    measured). `settings`: the fast path's, for a stepper built here. `mix`: the requests' text and clones
    (`StreamMix`)."""
    stepper = stepper if stepper is not None else BatchedStepper(model, max(concurrency), device, settings=settings)
    overlap = codec_overlap
    rows = []
    for n in concurrency:
        requests = stream_requests(model, n, frames, seed, mix)
        run_burst(stepper, model.codec, stream_requests(model, n, 2, seed + 1000, mix), device)  # warm this size
        reset_peak_memory(device)
        row = {"streams": n, "cfg_streams": sum(1 for q in requests if q.uses_cfg),
               "clone_streams": sum(1 for q in requests if q.reference is not None), "frames_per_stream": frames,
               **_burst_figures(run_burst(stepper, model.codec, requests, device, overlap=overlap,
                                          stall_dump_s=stall_dump_s), n),
               "peak_memory_bytes": peak_memory_bytes(device), "codec": model.codec is not None,
               "batch_shape": list(_burst_shape(stepper, n))}
        if compare_overlap and model.codec is not None:
            row["other_overlap"] = _burst_figures(
                run_burst(stepper, model.codec, requests, device, overlap=not overlap, stall_dump_s=stall_dump_s), n)
        if lm_only:  # the same burst without the codec: the language model's step alone
            alone = run_burst(stepper, None, requests, device, stall_dump_s=stall_dump_s)
            lm_steps = alone["step_times_s"][1:] or alone["step_times_s"]
            row["lm_only_step_ms_p50"] = 1000 * statistics.median(lm_steps)
        log.info("%d streams: %.1fx real time (steady %.1fx), stream RTF max %.3f, TTFA p95 %.0f ms, step %.1f ms "
                 "(LM %s, codec %s, overlap %s)", n, row["aggregate_x_realtime"], row["steady_x_realtime"],
                 row["stream_rtf_max"], row["ttfa_ms_p95"], row["step_ms_p50"], _ms(row["lm_ms_p50"]),
                 _ms(row["codec_ms_p50"]), row["overlap"])
        rows.append(row)
        if on_row is not None:
            on_row(rows)
    return rows


def _burst_figures(r: dict, n: int) -> dict:
    """A burst's figures: aggregate and steady real-time factor, per-stream RTF, TTFA, step times."""
    audio = {k: len(f) / FRAME_RATE_HZ for k, f in r["frames"].items()}
    rtf = [(r["done"][k] - r["t0"]) / audio[k] for k in audio]
    ttfa = [1000 * (r["first_audio"][k] - r["t0"]) for k in audio]
    steady = r["step_times_s"][1:] or r["step_times_s"]
    step_ms = 1000 * statistics.median(steady)
    return {
        "overlap": r["overlap"], "aggregate_x_realtime": sum(audio.values()) / r["wall_s"],
        # audio per step over the step's time: the burst's rate once every stream is running
        "steady_x_realtime": n / FRAME_RATE_HZ / (step_ms / 1000),
        "stream_rtf_p50": statistics.median(rtf), "stream_rtf_p95": _pct(rtf, 0.95), "stream_rtf_max": max(rtf),
        "ttfa_ms_p50": statistics.median(ttfa), "ttfa_ms_p95": _pct(ttfa, 0.95), "ttfa_ms_max": max(ttfa),
        "step_ms_p50": step_ms, "first_step_ms": 1000 * r["step_times_s"][0],
        "lm_ms_p50": _median(r["lm_ms"][1:] or r["lm_ms"]),
        "codec_ms_p50": _median(r["codec_ms"][1:] or r["codec_ms"]),
        "wall_s": r["wall_s"], "join_ms": 1000 * r["join_s"], "step_ms_max": 1000 * max(r["step_times_s"]),
        "slow_steps": _slow_steps(r, step_ms),
    }


def _slow_steps(r: dict, median_ms: float, factor: float = 5.0) -> list[dict]:
    """Steps that took more than `factor` x the median (host time), with their device parts: where a burst's
    time went when its wall time and its median step disagree."""
    lm, codec = r["lm_ms"], r["codec_ms"]
    out = []
    for i, seconds in enumerate(r["step_times_s"]):
        if 1000 * seconds > factor * median_ms:
            out.append({"step": i, "ms": 1000 * seconds, "lm_ms": lm[i] if i < len(lm) else None,
                        "codec_ms": codec[i] if i < len(codec) else None})
    return out


def _burst_shape(stepper: BatchedStepper, n: int) -> tuple[int, int]:
    """The batch shape a burst of n streams (half CFG) runs in on this stepper."""
    need = burst_need(n)
    if not stepper.bucketed:
        return need
    return pick_shape(stepper.graphs.shapes, *need) or need


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def alone_frames(stepper: BatchedStepper, requests: list, device: torch.device) -> list[list[torch.Tensor]]:
    """Each request's frames with the stepper to itself."""
    return [run_burst(stepper, None, [req], device)["frames"][0] for req in requests]


def agreement(model: LoadedModel, device: torch.device, *, streams: int, frames: int, seed: int,
              stepper: BatchedStepper | None = None, batch_joins: bool | None = None,
              alone: list | None = None, settings: FastPathSettings | None = None) -> dict:
    """Frames of `streams` streams (half CFG) batched vs each alone: the fraction of identical frames, and
    per stream the first frame that differs (None: all equal). `batch_joins`: prefill the joiners together
    (True) or each on its own, exactly as alone (False); None: the stepper's setting. `alone`: the
    `alone_frames` of the same requests, when already computed. `settings`: the fast path's, for a stepper
    built here."""
    stepper = stepper if stepper is not None else BatchedStepper(model, streams, device, settings=settings)
    requests = stream_requests(model, streams, frames, seed)
    saved = stepper.batch_joins
    if batch_joins is not None:
        stepper.batch_joins = batch_joins
    try:
        together = run_burst(stepper, None, requests, device)["frames"]
    finally:
        stepper.batch_joins = saved
    alone = alone if alone is not None else alone_frames(stepper, requests, device)
    first_diff, equal, total = [], 0, 0
    for k in range(len(requests)):
        same = [torch.equal(a, b) for a, b in zip(alone[k], together[k])]
        equal += sum(same)
        total += max(len(alone[k]), len(together[k]))
        first_diff.append(next((i for i, s in enumerate(same) if not s), None))
    return {"streams": streams, "frames": frames, "identical_fraction": equal / max(total, 1),
            "first_differing_frame": first_diff,
            "prefill": "batched" if (saved if batch_joins is None else batch_joins) else "per-stream"}


def check_targets(rows: list[dict], batch1_ms: float | None, batch1_source: str | None = None) -> dict:
    """The serving targets (`TARGETS`: 150x real time at 32 streams, every stream's RTF <= 0.5, TTFA p95 <=
    300 ms) and whether one stream through the batched engine is no slower than the batch-1 fast path, compared
    by the language model's time per frame without the codec (`lm_only_step_ms_p50`, the quantity the batch-1
    fast path's ms per frame measures)."""
    at32 = next((r for r in rows if r["streams"] == 32), None)
    one = next((r for r in rows if r["streams"] == 1), None)
    out: dict[str, object] = {"targets": TARGETS, "batch1_reference_ms_per_frame": batch1_ms,
                              "batch1_reference_source": batch1_source}
    if at32 is not None:
        out["aggregate_at_32_met"] = at32["aggregate_x_realtime"] >= TARGETS["aggregate_x_at_32"]
        out["stream_rtf_at_32_met"] = at32["stream_rtf_max"] <= TARGETS["stream_rtf_max"]
        out["ttfa_p95_at_32_met"] = at32["ttfa_ms_p95"] <= TARGETS["ttfa_p95_ms"]
    if one is not None:
        lm = one.get("lm_only_step_ms_p50")
        one_lm_ms = lm if lm is not None else one["step_ms_p50"]
        out["one_stream_lm_ms_per_frame"] = one_lm_ms
        out["one_stream_step_ms"] = one["step_ms_p50"]
        if batch1_ms is not None:
            out["one_stream_no_worse_than_batch1"] = one_lm_ms <= batch1_ms * 1.02
    return out


def _other(figures: dict | None) -> str:
    if not figures:
        return "-"
    return f"{figures['aggregate_x_realtime']:.1f} / {figures['step_ms_p50']:.2f}"


def table(rows: list[dict]) -> str:
    head = (f"{'streams':>7} {'cfg':>4} {'shape':>6} {'agg x RT':>9} {'steady x':>9} {'RTF p50':>8} {'RTF max':>8} "
            f"{'TTFA p50':>9} {'TTFA p95':>9} {'step ms':>8} {'LM ms':>7} {'codec ms':>8} {'LM-only':>8} "
            f"{'GPU GiB':>8} {'overlap':>7} {'other: agg x / step ms':>22}")
    lines = [head]

    def num(value, width, digits=2):
        return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"

    for r in rows:
        mem = r["peak_memory_bytes"]
        shape = "x".join(str(v) for v in r.get("batch_shape") or [])
        lines.append(f"{r['streams']:>7} {r['cfg_streams']:>4} {shape:>6} {r['aggregate_x_realtime']:>9.1f} "
                     f"{num(r.get('steady_x_realtime'), 9, 1)} {r['stream_rtf_p50']:>8.3f} {r['stream_rtf_max']:>8.3f} "
                     f"{r['ttfa_ms_p50']:>9.1f} {r['ttfa_ms_p95']:>9.1f} {r['step_ms_p50']:>8.2f} "
                     f"{num(r.get('lm_ms_p50'), 7)} {num(r.get('codec_ms_p50'), 8)} "
                     f"{num(r.get('lm_only_step_ms_p50'), 8)} {(mem / 2**30 if mem else 0):>8.2f} "
                     f"{('on' if r.get('overlap') else 'off'):>7} {_other(r.get('other_overlap')):>22}")
    return "\n".join(lines)
