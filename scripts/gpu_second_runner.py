"""Does the fast path's CFG frame slow down once a second runner (CFG off: 1 row) exists in the process?
(results/NOTES.md run 38.) Run 37: `breeze-worker bench --cfg on` 7.77 / 7.86 ms a frame in their own
processes, `--cfg off,on` 8.12 (the CFG-off runner built first), the same kernels and kernel time.

One process, full-size model (seeded random weights, BF16, end of speech masked), 64-frame requests through
bench/runner.run_once (with the codec between frames, as the bench), median ms per frame of 3 requests:
  phase 1: CFG on, only its runner built
  phase 2: CFG off (its runner built now), then CFG on again
  phase 3: CFG on after gc.collect() + gc.freeze() (the collector stops scanning what exists now)
  phase 4: CFG on with the collector disabled

    BREEZE_COMMIT=<sha> PYTHONPATH=worker:client:protos:scripts python3 scripts/gpu_second_runner.py --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics

import torch

import gpu_fused
from breeze_worker.bench.models import random_model
from breeze_worker.bench.runner import make_request, mask_end_of_speech, run_once
from breeze_worker.engine.precision import choose_policy


def timed(model, request, device, repeats: int = 3) -> dict:
    runs = [run_once("fast-compiled", model, request, device) for _ in range(repeats)]
    per = [1000 * statistics.median(r.frame_times_s) for r in runs]
    return {"ms_per_frame": statistics.median(per), "runs_ms": per}


def print_phases(tag: str, phases: dict) -> None:
    """One line per phase of `timed` results: median ms per frame and each request's."""
    for name, v in phases.items():
        print(f"[{tag}] {name:28s} {v['ms_per_frame']:.3f} ms/frame, runs {[round(x, 3) for x in v['runs_ms']]}",
              flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--dry-run", action="store_true", help="the CPU and the tiny model")
    args = parser.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    result = gpu_fused.gpu_result(device.type)
    model = random_model("tiny" if args.dry_run else "full", 1234, device,
                         choose_policy("fp32" if args.dry_run else "bf16", device))
    mask_end_of_speech(model)
    frames = 4 if args.dry_run else 64
    cfg_on, cfg_off = make_request(model, True, frames, 1234), make_request(model, False, frames, 1234)
    phases = {}
    run_once("fast-compiled", model, cfg_on, device)  # first use: compile, capture
    phases["1_cfg_only_runner"] = timed(model, cfg_on, device)
    run_once("fast-compiled", model, cfg_off, device)
    phases["2_cfg_off"] = timed(model, cfg_off, device)
    phases["2_cfg_after_second_runner"] = timed(model, cfg_on, device)
    gc.collect()
    gc.freeze()
    phases["3_cfg_gc_frozen"] = timed(model, cfg_on, device)
    gc.unfreeze()
    gc.disable()
    try:
        phases["4_cfg_gc_disabled"] = timed(model, cfg_on, device)
    finally:
        gc.enable()
    phases["5_cfg_again"] = timed(model, cfg_on, device)
    result["phases"] = phases
    print_phases("second-runner", phases)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
