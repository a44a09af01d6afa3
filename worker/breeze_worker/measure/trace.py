"""Trace one streaming request into a Chrome / Perfetto trace (engine/tracing.py).

Spans: request > text_encode, prefill, frame > ...; with `sync_marks` an instant `gpu_sync` mark (op and
source line) at every host sync, found by measure/syncaudit.py (which adds Python overhead to every tensor
operation: turn the marks off to read span durations).

Both decode paths record their own spans; this module adds the request and the consumer's work per frame
(codec_decode, emit), which fall inside the generator's frame span (it stays open across the `yield`).
- eager (engine/eager.py): frame > backbone_step (feeding back frame i-1; frame 0's logits come from the
  prefill), sampling (codebook 0), depth_steps > depth_step, sampling (codebooks 1..15).
- fast (engine/fastpath/generator.py): frame > fast_step (the sampling half and the frame's one host read;
  with CUDA graphs off, as on the CPU, it holds sampling and depth_steps > depth_step, sampling; with graphs
  on it is one replay) and backbone_step (the NEXT frame's backbone step, queued before the frame is handed
  out: inside fast_step, before its host read, unless BREEZE_FASTPATH_READ_OVERLAP=off puts it after; absent
  from the last frame).
"""

from __future__ import annotations

import collections
import contextlib

import numpy as np
import torch

from breeze_worker.engine import tracing
from breeze_worker.engine.codec_rows import CodecRows
from breeze_worker.engine.session import encode_pcm
from breeze_worker.engine.types import PcmEncoding
from breeze_worker.measure.setup import frame_source
from breeze_worker.measure.syncaudit import SyncDetector


def _decode(rows: CodecRows, frame: torch.Tensor) -> np.ndarray:
    """The engine's codec step (a CUDA graph replay on CUDA) for the traced stream."""
    return rows.decode({0: frame})[0]


def trace_request(model, request, device: torch.device, path: str, tracer: tracing.Tracer,
                  sync_marks: bool = True, settings=None) -> int:
    """Run one request on `path` with `tracer` recording; returns the number of frames. `settings`: the fast
    path's (None: the defaults)."""
    codec = model.codec
    frames = 0
    rows = CodecRows(codec) if codec is not None else None
    if rows is not None:  # before the detector: a first use captures the codec's graph
        rows.add(0)
    with tracer.recording():
        detector = (SyncDetector(device, on_sync=lambda e: tracing.mark("gpu_sync", op=e.op, site=e.site,
                                                                          code=e.code))
                    if sync_marks else contextlib.nullcontext())
        with tracing.span("request", path=path, cfg=request.uses_cfg, max_frames=request.max_frames), detector:
            gen = frame_source(path, model, request, device, settings=settings)
            for frame in gen:
                if rows is not None:
                    with tracing.span("codec_decode", index=frames):
                        pcm = _decode(rows, frame)
                else:
                    pcm = np.zeros(0, dtype=np.float32)
                with tracing.span("emit", index=frames):
                    encode_pcm(pcm, PcmEncoding.S16LE)
                frames += 1
            if device.type == "cuda":  # the trace's own wait for the device: not a mark
                with detector.paused() if isinstance(detector, SyncDetector) else contextlib.nullcontext():
                    torch.cuda.synchronize(device)
    if rows is not None:
        rows.remove(0)
    return frames


def summarize(tracer: tracing.Tracer) -> list[dict]:
    """Per span name: count, total and mean milliseconds; per mark name: count."""
    totals: dict[str, list[float]] = collections.defaultdict(list)
    marks: collections.Counter = collections.Counter()
    for e in tracer.events:
        if e.dur_ns is None:
            marks[e.name] += 1
        else:
            totals[e.name].append(e.dur_ns / 1e6)
    spans = sorted(totals.items(), key=lambda item: -sum(item[1]))  # the longest total first
    rows: list[dict] = [{"name": n, "kind": "span", "count": len(v), "total_ms": sum(v), "mean_ms": sum(v) / len(v)}
                        for n, v in spans]
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
