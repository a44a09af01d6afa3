"""GPU experiment: where the codec overlap's stalls come from (issue 8; results/batching/NOTES.md run 3).

In runs 1-3 of this session, every 16-stream burst with the codec overlapped (its own CUDA stream) had
steps whose host wait for the codec's audio took ~8.7 s (or a multiple), while the same bursts with the
codec on the language model's stream, and the 1-, 8- and 32-stream bursts either way, had none; the
device time of the stalled steps' language-model and codec parts was normal (20 ms / 11 ms).

This script builds the full-size random-weight model (bf16) once and runs bursts of N streams (half CFG,
48 frames, end of speech masked) in variants that change one thing each, counting the steps over 1 s:
  overlap-16            the engine's overlap path as it is (codec graphs with per-shape convolution forms)
  serial-16             the codec on the language model's stream (the default since run 3)
  overlap-16-untuned    codec graphs captured without the convolution tuner (cuDNN only)
  overlap-16-eager      the 16-slot codec step eager (no graph; cuDNN's heuristic algorithms), the other
                        buckets graphed
  overlap-16-heuristic  codec graphs captured with cuDNN's heuristic algorithms (no benchmark mode, no tuner)
  overlap-16-lm-eager   the language model's step uncompiled (library kernels only), still graphed
  overlap-12            12 streams: the same buckets (16 codec slots, 16x32 rows), fewer live rows
  overlap-8             8 streams (no stall seen there), as a control
Usage: PYTHONPATH=worker:client:protos python3 scripts/gpu_overlap_stall.py --json out.json [--variants a,b]
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import torch

from breeze_worker.bench import concurrency as sweep
from breeze_worker.bench.models import random_model
from breeze_worker.bench.runner import mask_end_of_speech
from breeze_worker.engine.batching import BatchedStepper
from breeze_worker.engine.fastpath.settings import FastPathSettings
from breeze_worker.engine.codec_graphs import SlotBatch, clear_convolution_forms, pool_for
from breeze_worker.engine.precision import choose_policy
from breeze_worker.engine.runtime import configure_codec_convolutions

VARIANTS = ("overlap-16", "overlap-16-eager", "overlap-16-untuned", "overlap-16-lm-eager", "serial-16",
            "overlap-12", "overlap-8", "overlap-16-heuristic")


def reset_codec_pool(codec, tuned: bool = True, eager_rows: int | None = None, benchmark: bool = True) -> None:
    """Empty the codec's slot pool and refill buckets 1..16 as the variant wants."""
    pool = pool_for(codec)
    pool._free.clear()
    decoder = codec.decoder
    clear_convolution_forms(decoder)
    rows = 1
    while rows <= 16:
        pool.release(SlotBatch(decoder, rows, use_graphs=None if rows != eager_rows else False, tune=tuned,
                               benchmark=benchmark))
        rows *= 2


def run_variant(name: str, model, steppers: dict, device, frames: int, seed: int, repeats: int) -> dict:
    streams = int(name.split("-")[1])
    overlap = name.startswith("overlap")
    stepper = steppers["uncompiled" if name.endswith("lm-eager") else "compiled"]
    reset_codec_pool(model.codec, tuned=not name.endswith(("untuned", "heuristic")),
                     eager_rows=16 if name.endswith("-eager") and not name.endswith("lm-eager") else None,
                     benchmark=not name.endswith("heuristic"))
    sweep.run_burst(stepper, model.codec, sweep.stream_requests(model, streams, 2, seed + 1000), device,
                    overlap=overlap)  # warm this size
    bursts = []
    for i in range(repeats):
        t0 = time.perf_counter()
        r = sweep.run_burst(stepper, model.codec, sweep.stream_requests(model, streams, frames, seed + i), device,
                            overlap=overlap)
        steps = r["step_times_s"]
        median_ms = 1000 * sorted(steps)[len(steps) // 2]
        bursts.append({"wall_s": time.perf_counter() - t0, "steps": len(steps), "median_step_ms": median_ms,
                       "stalls": sum(1 for s in steps if s > 1.0), "stall_s": sum(s for s in steps if s > 1.0),
                       "slow_steps": sweep._slow_steps(r, median_ms)})
    out = {"variant": name, "streams": streams, "overlap": overlap, "bursts": bursts,
           "stalls": sum(b["stalls"] for b in bursts)}
    print(json.dumps({k: v for k, v in out.items() if k != "bursts"} |
                     {"walls_s": [round(b["wall_s"], 2) for b in bursts],
                      "median_step_ms": [round(b["median_step_ms"], 2) for b in bursts]}), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run of the script itself")
    parser.add_argument("--size", default="full", help="full, or tiny / mid for a smoke run")
    args = parser.parse_args()
    device = torch.device(args.device)
    configure_codec_convolutions(device)
    policy = choose_policy("bf16" if device.type == "cuda" else "fp32", device)
    torch.manual_seed(args.seed)
    model = random_model(args.size, args.seed, device, policy)
    from dataclasses import replace

    model.generation_defaults = replace(model.generation_defaults, max_sequence=256)
    mask_end_of_speech(model)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {VARIANTS}")
    t0 = time.perf_counter()
    steppers = {"compiled": BatchedStepper(model, 16, device, shapes=[(8, 16), (16, 32)])}
    if any(v.endswith("lm-eager") for v in names):
        steppers["uncompiled"] = BatchedStepper(model, 16, device, shapes=[(16, 32)],
                                                settings=FastPathSettings(compile="off"))
    doc = {"schema": "breeze-overlap-stall/1",
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": args.commit,
           "build_s": time.perf_counter() - t0, "frames": args.frames, "variants": []}
    print(f"steppers built in {doc['build_s']:.1f} s", flush=True)
    for name in names:
        doc["variants"].append(run_variant(name, model, steppers, device, args.frames, args.seed, args.repeats))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
