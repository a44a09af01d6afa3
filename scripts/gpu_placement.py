"""Does where the weights sit in device memory move the fast path's frame time? (results/NOTES.md run 41)

The same code measured 7.77-8.54 ms a frame in different processes and ~1% apart inside one (runs 33-38).
One process here builds the full-size model (seeded random weights, BF16) three times, each with another
allocation history, so the same values sit at other addresses:
  first    as `breeze-worker bench` builds it (FP32 parameters drawn, then converted: the BF16 tensors land in
           the freed FP32 blocks)
  shifted  after 24 GB of other allocations are held and the allocator's cache is emptied
  fresh    after the held allocations are freed and the cache emptied again
Each model gets its own runner (CUDA graphs captured now); then the models are measured in turn over ROUNDS
rounds (the order rotating), 32-frame CFG requests, median ms per frame; frames must be identical across
the models (same weights, same arithmetic).

    BREEZE_COMMIT=<sha> PYTHONPATH=worker:client:protos:scripts python3 scripts/gpu_placement.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import gpu_fused
from breeze_worker.bench.models import random_model
from breeze_worker.bench.runner import make_request, mask_end_of_speech, run_once
from breeze_worker.engine.fastpath import graph
from breeze_worker.engine.precision import choose_policy


def weight_span(model) -> dict:
    """Where the language model's weights sit: lowest and highest address, how many distinct 2 MB pages."""
    ptrs = [(p.data_ptr(), p.numel() * p.element_size()) for p in model.lm.parameters()]
    pages = {a >> 21 for ptr, n in ptrs for a in range(ptr, ptr + n, 1 << 21)}
    low = min(p for p, _ in ptrs)
    high = max(p + n for p, n in ptrs)
    return {"span_gb": (high - low) / 1e9, "pages_2mb": len(pages), "bytes_gb": sum(n for _, n in ptrs) / 1e9}


@torch.no_grad()
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--dry-run", action="store_true", help="the CPU and the tiny model")
    args = parser.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    size, path = ("tiny", "fast-uncompiled") if args.dry_run else ("full", "fast-compiled")
    doc = {"schema": "breeze-placement/1", **gpu_fused.gpu_result(device.type)}
    policy = choose_policy("fp32" if args.dry_run else "bf16", device)
    models, held = {}, []

    def build(label: str) -> None:
        t0 = time.perf_counter()
        model = random_model(size, 1234, device, policy, with_codec=False)
        mask_end_of_speech(model)
        models[label] = model
        print(f"[placement] {label} built in {time.perf_counter() - t0:.1f} s, {weight_span(model)}", flush=True)

    build("first")
    if device.type == "cuda":
        held.extend(torch.empty(1 << 30, dtype=torch.uint8, device=device) for _ in range(24))
        torch.cuda.empty_cache()
    build("shifted")
    held.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    build("fresh")
    requests = {label: make_request(m, True, args.frames, 1234) for label, m in models.items()}
    for label, model in models.items():  # each model's runner captured now (the pool is keyed by model)
        t0 = time.perf_counter()
        run_once(path, model, requests[label], device)
        print(f"[placement] {label} first use {time.perf_counter() - t0:.1f} s", flush=True)
    labels = list(models)
    per = {label: [] for label in labels}
    codes = {}
    for i in range(args.rounds):
        for label in labels[i % 3:] + labels[:i % 3]:
            result = run_once(path, models[label], requests[label], device)
            per[label].append(1000 * statistics.median(result.frame_times_s))
            codes.setdefault(label, torch.stack(result.frames))
    ms = {label: statistics.median(v) for label, v in per.items()}
    same = {label: bool(torch.equal(codes[label], codes["first"])) for label in labels}
    for label in labels:
        print(f"[placement] {label}: {ms[label]:.3f} ms/frame ({ms[label] / ms['first']:.3f} of first), frames equal "
              f"to first: {same[label]}, runs {[round(v, 3) for v in per[label]]}", flush=True)
    doc.update({"frames": args.frames, "rounds": args.rounds, "ms_per_frame": ms, "runs_ms": per,
                "frames_equal_to_first": same, "weights": {k: weight_span(m) for k, m in models.items()}})
    graph.clear_runners()
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
