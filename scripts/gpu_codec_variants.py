"""GPU comparison of ways to run the full-size codec step (issue 8: the 32-slot codec step took 33.9 ms,
two thirds of the batched step; results/batching/NOTES.md run 2).

Per bucket (--buckets, default 1,8,32) and variant, one captured `SlotBatch` (engine/codec_graphs.py) on
the full-size decoder with seeded random weights:
  fp32-heuristic   true FP32 convolutions, cuDNN's heuristic algorithm choice (the engine before b3b55b7's
                   follow-up)
  fp32-benchmark   true FP32, cuDNN benchmark mode at capture (the engine's default since then)
  tf32-benchmark   TF32 convolutions (the worker's `codec_tf32` setting), benchmark mode
Measured: ms per step (codes up, one replay, audio to the host) with every slot active, median of
--repeats; the same frames decoded by each variant from the same start, compared with fp32-heuristic:
max abs difference and SNR in dB (10 log10 of signal energy over difference energy; inf when equal).
Then the kernels of one eager step at the largest bucket (true FP32, heuristic; torch.profiler, top 15 by
device time), to name what the step spends its time in. Prints a table last; --json writes everything.
Usage: PYTHONPATH=worker:client:protos python3 scripts/gpu_codec_variants.py --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import time

import torch

from breeze_worker.bench.models import decoder_only_codec
from breeze_worker.engine.codec_graphs import SlotBatch

VARIANTS = {"fp32-heuristic": (False, False), "fp32-benchmark": (True, False), "tf32-benchmark": (True, True)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def frames_for(rows: int, frames: int, seed: int, device: torch.device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = [torch.randint(0, 2048, (rows, 16), generator=g) for _ in range(frames)]
    return [f.pin_memory() for f in out] if device.type == "cuda" else out


def run_variant(decoder, rows: int, benchmark: bool, tf32: bool, frames: list[torch.Tensor], repeats: int) -> dict:
    batch = SlotBatch(decoder, rows, benchmark=benchmark, tf32=tf32)
    audio = [batch.step(f).cpu() for f in frames]  # from silence: the same start for every variant
    times = []
    for i in range(repeats):
        sync(decoder.device)
        t0 = time.perf_counter()
        batch.step(frames[i % len(frames)]).cpu()
        times.append(1000 * (time.perf_counter() - t0))
    return {"graphed": batch.graphed, "fallback_reason": batch.fallback_reason, "capture_s": batch.capture_s,
            "ms_per_step": statistics.median(times), "ms_min": min(times), "audio": torch.stack(audio)}


def compare(audio: torch.Tensor, reference: torch.Tensor) -> dict:
    diff = (audio.double() - reference.double())
    noise = float((diff ** 2).sum())
    signal = float((reference.double() ** 2).sum())
    return {"max_abs_diff": float(diff.abs().max()),
            "snr_db": math.inf if noise == 0 else 10 * math.log10(signal / noise),
            "nonfinite": int((~torch.isfinite(audio)).sum())}


def kernel_profile(decoder, rows: int, top: int = 15) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    device = decoder.device
    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    state = decoder.new_stream(rows)
    codes = torch.randint(0, 2048, (rows, 16, 1), device=decoder.device)
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=False, allow_tf32=False), \
            torch.inference_mode():
        for _ in range(2):
            decoder.decode_stream(codes, state)
        sync(device)
        with profile(activities=[activity]) as prof:
            decoder.decode_stream(codes, state)
            sync(device)

    def spent(e) -> float:  # kernels on CUDA; on the CPU (a smoke run of this script) the ops' own time
        return e.device_time_total if device.type == "cuda" else e.self_cpu_time_total

    events = [e for e in prof.key_averages() if spent(e) > 0]
    events.sort(key=spent, reverse=True)
    total = sum(spent(e) for e in events)
    return [{"kernel": e.key[:120], "calls": e.count, "us": spent(e),
             "share": spent(e) / total if total else 0.0} for e in events[:top]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buckets", default="1,8,32")
    parser.add_argument("--frames", type=int, default=4, help="frames decoded by every variant for the comparison")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", default=None)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run of the script itself")
    args = parser.parse_args()
    device = torch.device(args.device)
    decoder = decoder_only_codec(seed=0, device=device).decoder
    flops = 5.0e9  # per frame per stream on the full-size decoder (scripts/codec_flops.py)
    out = {"schema": "breeze-codec-variants/1",
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": args.commit,
           "gflop_per_frame_per_stream": flops / 1e9, "rows": []}
    for rows in [int(b) for b in args.buckets.split(",") if b]:
        frames = frames_for(rows, args.frames, seed=rows, device=device)
        results = {name: run_variant(decoder, rows, bench, tf32, frames, args.repeats)
                   for name, (bench, tf32) in VARIANTS.items()}
        reference = results["fp32-heuristic"]["audio"]
        for name, r in results.items():
            row = {"rows": rows, "variant": name, **{k: v for k, v in r.items() if k != "audio"},
                   **compare(r["audio"], reference),
                   "tflop_per_s": rows * flops / (r["ms_per_step"] / 1000) / 1e12}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
    out["kernels_eager_fp32_heuristic"] = {"rows": max(int(b) for b in args.buckets.split(",") if b),
                                           "top": kernel_profile(decoder, max(int(b) for b in args.buckets.split(",")))}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    print(f"{'rows':>4} {'variant':>15} {'ms/step':>8} {'TFLOP/s':>8} {'SNR dB':>8} {'max diff':>9} graphed")
    for r in out["rows"]:
        print(f"{r['rows']:>4} {r['variant']:>15} {r['ms_per_step']:>8.2f} {r['tflop_per_s']:>8.1f} "
              f"{r['snr_db']:>8.1f} {r['max_abs_diff']:>9.2e} {r['graphed']}")
    print("eager step kernels (largest bucket, FP32 heuristic):")
    for k in out["kernels_eager_fp32_heuristic"]["top"]:
        print(f"  {k['share']:6.1%} {k['us']:9.0f} us x{k['calls']:<4} {k['kernel']}")


if __name__ == "__main__":
    main()
