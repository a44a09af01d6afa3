"""Does the bench's own instrumentation slow the frames timed after it? (results/NOTES.md run 43)

`breeze-worker bench` times a variant's requests, then counts its host syncs (CUDA's sync debug mode and the
wrapped explicit waits) and profiles one short request under torch.profiler (GPU-busy fraction). With
`--cfg off,on` (or eager first) the CFG-on frames are timed after another variant's counting and profiling.
Runs 34-37: CFG on measured 7.77 / 7.86 ms a frame in processes that timed it first, 8.12-8.54 in processes
that ran another variant first.

One process, the bench's model (full size, seeded random weights, BF16, codec) and request (CFG on, 64
frames, end of speech masked), the bench's loop (bench/runner.run_once), median ms per frame of 3 requests
(gpu_second_runner.timed), in phases:
  1 fresh            nothing but the first use before it
  2 after_syncs      after one request with the sync counter (bench/measure.SyncCounter.counting)
  3 after_profiler   after one short request under torch.profiler (bench/measure.gpu_busy_fraction)
  4 again            once more (does it last?)

    BREEZE_COMMIT=<sha> PYTHONPATH=worker:client:protos:scripts python3 scripts/gpu_after_profiler.py --json out.json
"""

from __future__ import annotations

import argparse
import json

import torch

import gpu_fused
from gpu_second_runner import print_phases, timed  # 3 requests, median ms per frame
from breeze_worker.bench.measure import gpu_busy_fraction
from breeze_worker.bench.models import random_model
from breeze_worker.bench.runner import make_request, mask_end_of_speech, run_once
from breeze_worker.engine.precision import choose_policy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    doc = {"schema": "breeze-after-profiler/1", **gpu_fused.gpu_result("cuda")}
    model = random_model("full", 1234, device, choose_policy("bf16", device))
    mask_end_of_speech(model)
    request, short = make_request(model, True, 64, 1234), make_request(model, True, 8, 1234)
    run_once("fast-compiled", model, request, device)  # first use: compile, capture
    phases = {"1_fresh": timed(model, request, device)}
    run_once("fast-compiled", model, short, device, count_syncs=True)
    phases["2_after_syncs"] = timed(model, request, device)
    busy = gpu_busy_fraction(device, lambda: run_once("fast-compiled", model, short, device))
    phases["3_after_profiler"] = timed(model, request, device)
    phases["4_again"] = timed(model, request, device)
    doc["phases"] = phases
    doc["busy_fraction"] = busy["busy_fraction"]
    print_phases("after", phases)
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
