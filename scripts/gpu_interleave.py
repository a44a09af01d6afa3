"""Why the bench's fast-path frame is slower than a back-to-back frame loop (results/NOTES.md run 36).

`breeze-worker bench` decodes each frame with the codec between two language-model frames (and times the
language model only); scripts/gpu_mlp_loop.py's frame A/B and the concurrency bench's batch-1 reference run
the frames back to back. Run 35: 8.48-8.54 ms a frame in the bench vs 7.92 back to back, on one machine.

One process, full-size model (seeded random weights, BF16, CFG on, end of speech masked), one request of
FRAMES frames per measurement, the fast path as the bench runs it. Between two frames (after the frame and
its queued backbone step are done on the device) one of:
  none    nothing (the A/B's loop)
  codec   the codec step of that frame (engine/codec_rows.py, as the bench)
  sleep   the host sleeps about as long as the codec step takes (the device idles)
  gemm    an FP32 matrix product of about that length (the device computes, not the codec)
Variants alternate over ROUNDS rounds; median ms per frame (language model only, as the bench) and the
interleaved work's ms. `nvidia-smi` samples SM clock and power every 50 ms in the background (clocks.log).

    BREEZE_COMMIT=<sha> PYTHONPATH=worker:client:protos:scripts python3 scripts/gpu_interleave.py --json out.json
    PYTHONPATH=worker:client:protos:scripts python3 scripts/gpu_interleave.py --json /tmp/i.json --dry-run  (CPU, tiny)

--pipeline-ab instead: a streaming consumer's loop (no wait beyond the generator's read; codec or nothing
between frames), frame-to-frame time, with one frame in flight (BREEZE_FASTPATH_PIPELINE) or not (run 39).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from dataclasses import replace

import torch

import gpu_fused
from breeze_worker.bench.models import random_model
from breeze_worker.bench.runner import make_request, mask_end_of_speech, open_generator
from breeze_worker.engine.codec_rows import CodecRows
from breeze_worker.engine.precision import choose_policy

ACTIONS = ("none", "codec", "sleep", "gemm")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def one_request(model, request, device, action: str, rows, gemm, sleep_s: float) -> dict:
    """The bench's loop (runner._run) with `action` between frames: ms per frame and the action's ms."""
    gen = open_generator("fast" if device.type == "cpu" else "fast-compiled", model, request, device)
    it = iter(gen)
    next(it)
    times, extra = [], []
    last = time.perf_counter()
    for frame in it:
        sync(device)  # the queued backbone step, as the bench waits for it
        t = time.perf_counter()
        times.append(t - last)
        if action == "codec":
            rows.decode({0: frame})
        elif action == "sleep":
            time.sleep(sleep_s)
        elif action == "gemm":
            a, b = gemm
            for _ in range(4):
                a @ b
            sync(device)
        last = time.perf_counter()
        extra.append(last - t)
    return {"ms_per_frame": 1000 * statistics.median(times), "extra_ms": 1000 * statistics.median(extra)}


def streaming(model, request, device, action: str, rows, pipeline: bool) -> dict:
    """A streaming consumer's loop: no wait for the device beyond the generator's own read, the codec step
    (or nothing) between frames; the time from one frame to the next, codec included. `pipeline`: the settings'
    pipeline on (one frame in flight) or off (the next backbone step queued before the read only)."""
    from breeze_worker.engine.fastpath.settings import FastPathSettings

    gen = open_generator("fast" if device.type == "cpu" else "fast-compiled", model, request, device,
                         FastPathSettings(pipeline=pipeline))
    it = iter(gen)
    next(it)
    times = []
    last = time.perf_counter()
    for frame in it:
        t = time.perf_counter()
        times.append(t - last)
        last = t
        if action == "codec":
            rows.decode({0: frame})
    sync(device)
    return {"ms_per_frame": 1000 * statistics.median(times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clocks", default=None, help="nvidia-smi's samples go here")
    parser.add_argument("--dry-run", action="store_true", help="the CPU, the tiny model, 2 rounds of 4 frames")
    parser.add_argument("--pipeline-ab", action="store_true",
                        help="instead: the streaming loop (`streaming`), pipelined or not, with and without the codec")
    args = parser.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    size = "tiny" if args.dry_run else "full"
    if args.dry_run:
        args.frames, args.rounds = 4, 2
    result = gpu_fused.gpu_result(device.type)
    sampler = None
    if args.clocks:
        sampler = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu",
                                    "--format=csv,noheader", "-lms", "50"], stdout=open(args.clocks, "w"))
    try:
        model = random_model(size, 1234, device, choose_policy("fp32" if args.dry_run else "bf16", device))
        mask_end_of_speech(model)
        lm_only = replace(model, codec=None)
        request = make_request(model, True, args.frames, 1234)
        rows = CodecRows(model.codec)
        rows.add(0)
        # the codec step's length, for the sleep and the product
        frame = torch.zeros(16, dtype=torch.long)
        for _ in range(3):
            rows.decode({0: frame})
        t0 = time.perf_counter()
        for _ in range(10):
            rows.decode({0: frame})
        codec_s = (time.perf_counter() - t0) / 10
        n = 4096 if device.type == "cuda" else 256
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        torch.backends.cuda.matmul.allow_tf32 = False
        sync(device)
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        sync(device)
        gemm_s = time.perf_counter() - t0
        scale = max(1, round(gemm_s / codec_s))
        if scale > 1:  # about the codec's length
            n = int(n / scale ** (1 / 3))
            a, b = a[:n, :n].contiguous(), b[:n, :n].contiguous()
        print(f"codec step {1000 * codec_s:.2f} ms; product n={n}", flush=True)
        result.update({"codec_step_ms": 1000 * codec_s, "gemm_n": n, "frames": args.frames, "rounds": args.rounds})
        one_request(lm_only, request, device, "none", rows, (a, b), codec_s)  # warm-up: capture, compile
        if args.pipeline_ab:
            labels = [(pipe, action) for action in ("none", "codec") for pipe in (False, True)]
            per_ab = {label: [] for label in labels}
            for i in range(args.rounds):
                for pipe, action in labels[i % len(labels):] + labels[:i % len(labels)]:
                    per_ab[(pipe, action)].append(streaming(lm_only, request, device, action, rows, pipe)["ms_per_frame"])
            result["streaming"] = {f"{'pipelined' if p else 'overlap'}/{a}": {"ms_per_frame": statistics.median(v),
                                                                             "runs_ms": v}
                                   for (p, a), v in per_ab.items()}
            for label, v in result["streaming"].items():
                print(f"[streaming] {label:17s}: {v['ms_per_frame']:.3f} ms from frame to frame, runs "
                      f"{[round(x, 3) for x in v['runs_ms']]}", flush=True)
            with open(args.json, "w") as fh:
                json.dump(result, fh, indent=2)
            return 0
        per = {action: [] for action in ACTIONS}
        for i in range(args.rounds):
            for action in ACTIONS[i % len(ACTIONS):] + ACTIONS[:i % len(ACTIONS)]:
                out = one_request(lm_only, request, device, action, rows, (a, b), codec_s)
                per[action].append(out)
                print(f"round {i} {action:5s}: {out['ms_per_frame']:.3f} ms/frame, between {out['extra_ms']:.2f} ms",
                      flush=True)
        result["variants"] = {action: {"ms_per_frame": statistics.median(o["ms_per_frame"] for o in v),
                                       "extra_ms": statistics.median(o["extra_ms"] for o in v),
                                       "runs_ms": [o["ms_per_frame"] for o in v]} for action, v in per.items()}
        for action, v in result["variants"].items():
            print(f"[interleave] {action:5s}: {v['ms_per_frame']:.3f} ms/frame "
                  f"({v['ms_per_frame'] / result['variants']['none']['ms_per_frame']:.3f} of none), "
                  f"between frames {v['extra_ms']:.2f} ms", flush=True)
    finally:
        if sampler is not None:
            sampler.terminate()
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
