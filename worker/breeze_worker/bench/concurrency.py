"""Concurrency sweep of the batched engine (issue 8): N streams at once, half of them with CFG.

For each N, N requests arrive together (a burst: the hardest case for time to first audio) and run
through the engine's own machinery, the `BatchedStepper` (one batched frame step per engine step) and
`CodecRows` (one batched codec call per step), with end of speech masked so each runs `frames` frames.
Measured per N: aggregate real-time factor (audio seconds per wall second, higher is better), per-stream
RTF (wall / audio, lower is better) and TTFA (arrival -> first decoded audio, p50 / p95), engine step time
and peak GPU memory. `agreement` compares each stream's frames batched with the same stream alone.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

from breeze_worker.bench.measure import peak_memory_bytes, reset_peak_memory, synchronize
from breeze_worker.bench.runner import INSTRUCTION
from breeze_worker.engine.batching import BatchedStepper
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


def run_burst(stepper: BatchedStepper, codec, requests: list, device: torch.device) -> dict:
    """All requests join at once; step until all ended. Returns frames per stream and timings."""
    rows = CodecRows(codec) if codec is not None else None
    keys = list(range(len(requests)))
    frames: dict[int, list] = {k: [] for k in keys}
    first_audio: dict[int, float] = {}
    done: dict[int, float] = {}
    step_times, codec_times = [], []
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
        outcomes = stepper.step()
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
                c0 = time.perf_counter()
                rows.decode(emitted)  # includes the one host read of the audio
                codec_times.append(time.perf_counter() - c0)
        else:
            synchronize(device)
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
            "step_times_s": step_times, "codec_times_s": codec_times}


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def measure_concurrency(model: LoadedModel, device: torch.device, concurrency: list[int], *, frames: int,
                        seed: int, stepper: BatchedStepper | None = None) -> list[dict]:
    stepper = stepper or BatchedStepper(model, max(concurrency), device)
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
        row = {
            "streams": n, "cfg_streams": sum(1 for q in requests if q.uses_cfg), "frames_per_stream": frames,
            "aggregate_x_realtime": sum(audio.values()) / r["wall_s"],
            "stream_rtf_p50": statistics.median(rtf), "stream_rtf_p95": _pct(rtf, 0.95), "stream_rtf_max": max(rtf),
            "ttfa_ms_p50": statistics.median(ttfa), "ttfa_ms_p95": _pct(ttfa, 0.95), "ttfa_ms_max": max(ttfa),
            "step_ms_p50": 1000 * statistics.median(steady), "first_step_ms": 1000 * r["step_times_s"][0],
            "codec_ms_p50": 1000 * statistics.median(r["codec_times_s"]) if r["codec_times_s"] else None,
            "wall_s": r["wall_s"], "peak_memory_bytes": peak_memory_bytes(device),
            "codec": model.codec is not None,
        }
        log.info("%d streams: %.1fx real time, stream RTF max %.3f, TTFA p95 %.0f ms", n,
                 row["aggregate_x_realtime"], row["stream_rtf_max"], row["ttfa_ms_p95"])
        rows.append(row)
    return rows


def agreement(model: LoadedModel, device: torch.device, *, streams: int, frames: int, seed: int,
              stepper: BatchedStepper | None = None) -> dict:
    """Frames of `streams` streams (half CFG) batched vs each alone: the fraction of identical frames, and
    per stream the first frame that differs (None: all equal)."""
    stepper = stepper or BatchedStepper(model, streams, device)
    requests = stream_requests(model, streams, frames, seed)
    together = run_burst(stepper, None, requests, device)["frames"]
    first_diff, equal, total = [], 0, 0
    for k, req in enumerate(requests):
        alone = run_burst(stepper, None, [req], device)["frames"][0]
        same = [torch.equal(a, b) for a, b in zip(alone, together[k])]
        equal += sum(same)
        total += max(len(alone), len(together[k]))
        first_diff.append(next((i for i, s in enumerate(same) if not s), None))
    return {"streams": streams, "frames": frames, "identical_fraction": equal / max(total, 1),
            "first_differing_frame": first_diff}


def check_targets(rows: list[dict], batch1_ms: float | None) -> dict:
    at32 = next((r for r in rows if r["streams"] == 32), None)
    one = next((r for r in rows if r["streams"] == 1), None)
    out = {"targets": TARGETS, "batch1_reference_ms_per_frame": batch1_ms}
    if at32 is not None:
        out["aggregate_at_32_met"] = at32["aggregate_x_realtime"] >= TARGETS["aggregate_x_at_32"]
        out["stream_rtf_at_32_met"] = at32["stream_rtf_max"] <= TARGETS["stream_rtf_max"]
        out["ttfa_p95_at_32_met"] = at32["ttfa_ms_p95"] <= TARGETS["ttfa_p95_ms"]
    if one is not None and batch1_ms is not None:
        out["one_stream_step_ms"] = one["step_ms_p50"]
        out["one_stream_no_worse_than_batch1"] = one["step_ms_p50"] <= batch1_ms * 1.02
    return out


def table(rows: list[dict]) -> str:
    head = (f"{'streams':>7} {'cfg':>4} {'agg x RT':>9} {'RTF p50':>8} {'RTF p95':>8} {'RTF max':>8} "
            f"{'TTFA p50':>9} {'TTFA p95':>9} {'step ms':>8} {'GPU GiB':>8}")
    lines = [head]
    for r in rows:
        mem = r["peak_memory_bytes"]
        lines.append(f"{r['streams']:>7} {r['cfg_streams']:>4} {r['aggregate_x_realtime']:>9.1f} "
                     f"{r['stream_rtf_p50']:>8.3f} {r['stream_rtf_p95']:>8.3f} {r['stream_rtf_max']:>8.3f} "
                     f"{r['ttfa_ms_p50']:>9.1f} {r['ttfa_ms_p95']:>9.1f} {r['step_ms_p50']:>8.2f} "
                     f"{(mem / 2**30 if mem else 0):>8.2f}")
    return "\n".join(lines)
