"""Concurrency sweep of the batched engine (issue 8): N streams at once, half of them with CFG.

For each N, N requests arrive together (a burst: the hardest case for time to first audio) and run
through the engine's own machinery, the `BatchedStepper` (one batched frame step per engine step) and
`CodecRows` (one batched codec call per step), with end of speech masked so each runs `frames` frames.
Measured per N: aggregate real-time factor (audio seconds per wall second, higher is better), per-stream
RTF (wall / audio, lower is better) and TTFA (arrival -> first decoded audio, p50 / p95), engine step time
and peak GPU memory. Each step's time is split into the language model's part (the batched frame step:
sample, host read, next backbone step) and the codec's, timed with CUDA events so that neither adds a
host sync; each N is also run once without the codec (`lm_only_step_ms_p50`, the figure comparable with
the batch-1 fast path's ms per frame). `agreement` compares each stream's frames batched with the same
stream alone, with the joiners' prompts prefilled together (the CUDA default) or one by one.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

from breeze_worker.bench.measure import peak_memory_bytes, reset_peak_memory, synchronize
from breeze_worker.bench.runner import INSTRUCTION
from breeze_worker.engine.batching import BatchedStepper, bucket_shapes, pick_shape
from breeze_worker.engine.codec_rows import CodecRows
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import SynthesisRequest
from breeze_worker.model.loaded import FRAME_RATE_HZ, LoadedModel

log = logging.getLogger(__name__)

TEXTS = ("The quick brown fox jumps over the lazy dog.",
         "Streaming speech for many callers at once, one frame per step.",
         "Short line.",
         "A somewhat longer sentence, so that prompts differ in length across the batch of streams.")
TARGETS = {"aggregate_x_at_32": 150.0, "stream_rtf_max": 0.5, "ttfa_p95_ms": 300.0}


def stream_requests(model: LoadedModel, n: int, frames: int, seed: int) -> list:
    """n requests, even-numbered with CFG (so 1 stream = CFG, and half of any even N)."""
    out = []
    for i in range(n):
        cfg = i % 2 == 0
        req = SynthesisRequest(text=TEXTS[i % len(TEXTS)], instruction=INSTRUCTION if cfg else None,
                               cfg_scale=2.0 if cfg else None, seed=seed + i, max_frames=frames)
        out.append(resolve_request(req, model.generation_defaults, None, tokenizer=model.tokenizer))
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
    return sorted({pick_shape(shapes, s, r) for s, r in needs} - {None})


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


def run_burst(stepper: BatchedStepper, codec, requests: list, device: torch.device) -> dict:
    """All requests join at once; step until all ended. Returns frames per stream and timings: per step the
    host wall time (`step_times_s`), and the language model's and the codec's parts (`lm_ms`, `codec_ms`)."""
    rows = CodecRows(codec) if codec is not None else None
    keys = list(range(len(requests)))
    frames: dict[int, list] = {k: [] for k in keys}
    first_audio: dict[int, float] = {}
    done: dict[int, float] = {}
    step_times = []
    clock = _StepClock(device)
    synchronize(device)
    t0 = time.perf_counter()
    errors = stepper.join(list(zip(keys, requests)))
    if errors:
        raise RuntimeError(f"join failed: {errors}")
    if rows is not None:
        for k in keys:
            rows.add(k)
    while len(done) < len(keys):
        s0 = time.perf_counter()
        m0 = clock.mark()
        outcomes = stepper.step()
        m1 = clock.mark()  # the next backbone step is queued: on CUDA this event closes the LM part
        emitted = {}
        for k, out in outcomes.items():
            if out.error is not None:
                raise out.error
            if out.frame is not None:
                frames[k].append(out.frame)
                emitted[k] = out.frame
        if rows is not None:
            for k, out in outcomes.items():  # streams that ended without a frame leave the codec batch
                if out.frame is None:
                    rows.remove(k)
            if emitted:
                rows.decode(emitted)  # includes the one host read of the audio
        else:
            synchronize(device)
        clock.add(m0, m1, clock.mark())
        now = time.perf_counter()
        step_times.append(now - s0)
        for k, out in outcomes.items():
            if out.frame is not None:
                first_audio.setdefault(k, now)
            if out.end_reason is not None or out.error is not None:
                done[k] = now
                if rows is not None and out.frame is not None:
                    rows.remove(k)
    wall = max(done.values()) - t0
    return {"frames": frames, "t0": t0, "first_audio": first_audio, "done": done, "wall_s": wall,
            "step_times_s": step_times, "lm_ms": clock.spans_ms(0, 1),
            "codec_ms": clock.spans_ms(1, 2) if rows is not None else []}


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure_concurrency(model: LoadedModel, device: torch.device, concurrency: list[int], *, frames: int,
                        seed: int, stepper: BatchedStepper | None = None, lm_only: bool = True,
                        on_row=None) -> list[dict]:
    """One row per N (see the module doc). `lm_only`: also time N streams without the codec. `on_row(rows)`
    is called after each N (the command rewrites its JSON, so a run cut short keeps what it measured)."""
    stepper = stepper if stepper is not None else BatchedStepper(model, max(concurrency), device)
    rows = []
    for n in concurrency:
        requests = stream_requests(model, n, frames, seed)
        run_burst(stepper, model.codec, stream_requests(model, n, 2, seed + 1000), device)  # warm this size
        reset_peak_memory(device)
        r = run_burst(stepper, model.codec, requests, device)
        audio = {k: len(f) / FRAME_RATE_HZ for k, f in r["frames"].items()}
        rtf = [(r["done"][k] - r["t0"]) / audio[k] for k in audio]
        ttfa = [1000 * (r["first_audio"][k] - r["t0"]) for k in audio]
        steady = r["step_times_s"][1:] or r["step_times_s"]
        step_ms = 1000 * statistics.median(steady)
        row = {
            "streams": n, "cfg_streams": sum(1 for q in requests if q.uses_cfg), "frames_per_stream": frames,
            "aggregate_x_realtime": sum(audio.values()) / r["wall_s"],
            # audio per step over the step's time: the burst's rate once every stream is running
            "steady_x_realtime": n / FRAME_RATE_HZ / (step_ms / 1000),
            "stream_rtf_p50": statistics.median(rtf), "stream_rtf_p95": _pct(rtf, 0.95), "stream_rtf_max": max(rtf),
            "ttfa_ms_p50": statistics.median(ttfa), "ttfa_ms_p95": _pct(ttfa, 0.95), "ttfa_ms_max": max(ttfa),
            "step_ms_p50": step_ms, "first_step_ms": 1000 * r["step_times_s"][0],
            "lm_ms_p50": _median(r["lm_ms"][1:] or r["lm_ms"]),
            "codec_ms_p50": _median(r["codec_ms"][1:] or r["codec_ms"]),
            "wall_s": r["wall_s"], "peak_memory_bytes": peak_memory_bytes(device),
            "codec": model.codec is not None, "batch_shape": list(_burst_shape(stepper, n)),
        }
        if lm_only:  # the same burst without the codec: the language model's step alone
            alone = run_burst(stepper, None, requests, device)
            lm_steps = alone["step_times_s"][1:] or alone["step_times_s"]
            row["lm_only_step_ms_p50"] = 1000 * statistics.median(lm_steps)
        log.info("%d streams: %.1fx real time (steady %.1fx), stream RTF max %.3f, TTFA p95 %.0f ms, step %.1f ms "
                 "(LM %s, codec %s)", n, row["aggregate_x_realtime"], row["steady_x_realtime"],
                 row["stream_rtf_max"], row["ttfa_ms_p95"], step_ms, _ms(row["lm_ms_p50"]), _ms(row["codec_ms_p50"]))
        rows.append(row)
        if on_row is not None:
            on_row(rows)
    return rows


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
              alone: list | None = None) -> dict:
    """Frames of `streams` streams (half CFG) batched vs each alone: the fraction of identical frames, and
    per stream the first frame that differs (None: all equal). `batch_joins`: prefill the joiners together
    (True) or each on its own, exactly as alone (False); None: the stepper's setting. `alone`: the
    `alone_frames` of the same requests, when already computed."""
    stepper = stepper if stepper is not None else BatchedStepper(model, streams, device)
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
    """The issue's targets. The 1-stream row is compared by the language model's time per frame without
    the codec (`lm_only_step_ms_p50`), the quantity the batch-1 fast path's ms per frame measures."""
    at32 = next((r for r in rows if r["streams"] == 32), None)
    one = next((r for r in rows if r["streams"] == 1), None)
    out = {"targets": TARGETS, "batch1_reference_ms_per_frame": batch1_ms, "batch1_reference_source": batch1_source}
    if at32 is not None:
        out["aggregate_at_32_met"] = at32["aggregate_x_realtime"] >= TARGETS["aggregate_x_at_32"]
        out["stream_rtf_at_32_met"] = at32["stream_rtf_max"] <= TARGETS["stream_rtf_max"]
        out["ttfa_p95_at_32_met"] = at32["ttfa_ms_p95"] <= TARGETS["ttfa_p95_ms"]
    if one is not None:
        lm = one.get("lm_only_step_ms_p50")
        out["one_stream_lm_ms_per_frame"] = lm if lm is not None else one["step_ms_p50"]
        out["one_stream_step_ms"] = one["step_ms_p50"]
        if batch1_ms is not None:
            out["one_stream_no_worse_than_batch1"] = out["one_stream_lm_ms_per_frame"] <= batch1_ms * 1.02
    return out


def table(rows: list[dict]) -> str:
    head = (f"{'streams':>7} {'cfg':>4} {'shape':>6} {'agg x RT':>9} {'steady x':>9} {'RTF p50':>8} {'RTF max':>8} "
            f"{'TTFA p50':>9} {'TTFA p95':>9} {'step ms':>8} {'LM ms':>7} {'codec ms':>8} {'LM-only':>8} "
            f"{'GPU GiB':>8}")
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
                     f"{num(r.get('lm_only_step_ms_p50'), 8)} {(mem / 2**30 if mem else 0):>8.2f}")
    return "\n".join(lines)
