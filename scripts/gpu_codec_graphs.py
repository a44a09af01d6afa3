"""GPU check of the graphed codec step (engine/codec_graphs.py, engine/codec_rows.py) on the full-size decoder.

Per bucket (1, 2, 4, ... --max-rows): capture time; the graph replay against the same step run eagerly at the
same width (expected bit-identical) and against plain decode_stream; ms per step of `CodecRows.decode` (host
codes up, one replay, the one host read) with every slot active, and of the eager step. Then time to first
audio of a new stream (CodecRows.add + first decode) with the bucket-1 graph already captured.
Usage: PYTHONPATH=worker:client:protos python3 scripts/gpu_codec_graphs.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

import torch

from breeze_worker.bench.models import decoder_only_codec
from breeze_worker.engine.codec_graphs import SlotBatch
from breeze_worker.engine.codec_rows import CodecRows


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def codes_for(rows: int, frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (frames, rows, 16), generator=torch.Generator().manual_seed(seed))


def check_bucket(codec, rows: int, frames: int) -> dict:
    graphed = SlotBatch(codec.decoder, rows)
    eager = SlotBatch(codec.decoder, rows, use_graphs=False)
    plain = codec.new_stream(rows)
    same_eager, same_plain, max_diff = 0, 0, 0.0
    for frame in codes_for(rows, frames, seed=rows):
        pinned = frame.pin_memory()
        a = graphed.step(pinned).cpu()
        b = eager.step(pinned).cpu()
        with torch.inference_mode():
            c = codec.decode_stream(frame.unsqueeze(-1).cuda(), plain).cpu()
        same_eager += int(torch.equal(a, b))
        same_plain += int(torch.equal(a, c))
        max_diff = max(max_diff, float((a - c).abs().max()))
    codec_rows = CodecRows(codec)
    for k in range(rows):
        codec_rows.add(k)
    frame = {k: codes_for(1, 1, seed=100 + k)[0, 0] for k in range(rows)}
    codec_rows.decode(frame)  # first call of this width: allocations
    return {
        "rows": rows, "graphed": graphed.graphed, "fallback_reason": graphed.fallback_reason,
        "capture_s": graphed.capture_s,
        "frames_equal_graph_vs_eager_same_width": same_eager / frames,
        "frames_equal_graph_vs_decode_stream": same_plain / frames, "max_abs_diff_vs_decode_stream": max_diff,
        "codec_rows_ms_per_step": timed(lambda: codec_rows.decode(frame), 20),
        "eager_ms_per_step": timed(lambda: eager.step(torch.zeros(rows, 16, dtype=torch.long)).cpu(), 5),
    }


def first_audio_ms(codec, repeats: int = 10) -> float:
    times = []
    frame = codes_for(1, 1, seed=7)[0, 0]
    for i in range(repeats):
        rows = CodecRows(codec)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        rows.add(i)
        rows.decode({i: frame})
        times.append(1000 * (time.perf_counter() - t0))
        rows.remove(i)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-rows", type=int, default=64)
    parser.add_argument("--frames", type=int, default=6)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    codec = decoder_only_codec(seed=0, device=torch.device("cuda"))
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "buckets": []}
    rows = 1
    while rows <= args.max_rows:
        out["buckets"].append(check_bucket(codec, rows, args.frames))
        print(json.dumps(out["buckets"][-1]), flush=True)
        rows *= 2
    out["first_audio_ms"] = first_audio_ms(codec)
    print("first audio (add + first decode, bucket 1 captured):", round(out["first_audio_ms"], 2), "ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
