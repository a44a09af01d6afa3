"""Trace one streaming request into a Chrome / Perfetto trace (engine/tracing.py).

Spans: request > text_encode, prefill, frame > (backbone_step, sampling, depth_steps > depth_step,
sampling), codec_decode, emit; with `sync_marks` an instant `gpu_sync` mark (op and source line) at every
host sync, found by engine/syncaudit.py (which adds Python overhead to every tensor operation: turn the
marks off to read span durations).

The eager path records its own spans (engine/eager.py); frame i's span starts with the backbone step that
feeds frame i-1 back (frame 0's logits come from the prefill). The fast path's frame is one graph replay
plus one host read (`fast_step`); it records no spans itself, so its `text_encode` and `prefill` spans
are placed from the generator's stage timings, and each `frame` span is added once the frame is emitted.
"""

from __future__ import annotations

import collections
import contextlib
import time

import numpy as np
import torch

from breeze_worker.engine import tracing
from breeze_worker.engine.session import encode_pcm
from breeze_worker.engine.syncaudit import SyncDetector
from breeze_worker.engine.types import PcmEncoding
from breeze_worker.profiling.setup import frame_source


def _decode(codec, stream, frame: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        pcm = codec.decode_stream(frame.reshape(1, -1, 1).to(codec.device), stream)
    return pcm.reshape(-1).float().cpu().numpy()


def trace_request(model, request, device: torch.device, path: str, tracer: tracing.Tracer,
                  sync_marks: bool = True) -> int:
    """Run one request on `path` with `tracer` recording; returns the number of frames."""
    codec = model.codec
    frames = 0
    with tracer.recording():
        detector = (SyncDetector(device, on_sync=lambda e: tracing.mark("gpu_sync", op=e.op, site=e.site,
                                                                          code=e.code))
                    if sync_marks else contextlib.nullcontext())
        with tracing.span("request", path=path, cfg=request.uses_cfg, max_frames=request.max_frames), detector:
            gen = frame_source(path, model, request, device)
            stream = codec.new_stream(1) if codec is not None else None
            it = iter(gen)
            while True:
                asked = time.perf_counter_ns()
                if path == "fast":
                    with tracing.span("fast_step", index=frames):
                        frame = next(it, None)
                else:
                    frame = next(it, None)
                if frame is None:
                    break
                got = time.perf_counter_ns()
                if path == "fast" and frames == 0:
                    asked = _place_setup_spans(tracer, asked, gen.timings)
                if stream is not None:
                    with tracing.span("codec_decode", index=frames):
                        pcm = _decode(codec, stream, frame)
                else:
                    pcm = np.zeros(0, dtype=np.float32)
                with tracing.span("emit", index=frames):
                    encode_pcm(pcm, PcmEncoding.S16LE)
                if path == "fast":
                    tracer.add_span("frame", asked, time.perf_counter_ns(), index=frames, step_ms=(got - asked) / 1e6)
                frames += 1
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    return frames


def _place_setup_spans(tracer: tracing.Tracer, start_ns: int, timings: dict) -> int:
    """Fast path: text_encode and prefill from the generator's timings; returns where frame 0 starts."""
    encode_end = start_ns + int(timings.get("text_encode_s", 0.0) * 1e9)
    prefill_end = encode_end + int(timings.get("prefill_s", 0.0) * 1e9)
    tracer.add_span("text_encode", start_ns, encode_end, placed_from="generator timings")
    tracer.add_span("prefill", encode_end, prefill_end, placed_from="generator timings")
    return prefill_end


def summarize(tracer: tracing.Tracer) -> list[dict]:
    """Per span name: count, total and mean milliseconds; per mark name: count."""
    totals: dict[str, list[float]] = collections.defaultdict(list)
    marks: collections.Counter = collections.Counter()
    for e in tracer.events:
        if e.dur_ns is None:
            marks[e.name] += 1
        else:
            totals[e.name].append(e.dur_ns / 1e6)
    rows = [{"name": n, "kind": "span", "count": len(v), "total_ms": sum(v), "mean_ms": sum(v) / len(v)}
            for n, v in totals.items()]
    rows.sort(key=lambda r: -r["total_ms"])
    rows += [{"name": n, "kind": "mark", "count": c, "total_ms": None, "mean_ms": None} for n, c in marks.items()]
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'span':<16}{'count':>7}{'total ms':>11}{'mean ms':>10}"]
    for r in rows:
        if r["kind"] == "span":
            lines.append(f"{r['name']:<16}{r['count']:>7}{r['total_ms']:>11.2f}{r['mean_ms']:>10.3f}")
        else:
            lines.append(f"{r['name'] + ' (mark)':<16}{r['count']:>7}")
    return "\n".join(lines)
