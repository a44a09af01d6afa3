"""`breeze-worker bench --concurrency 1,2,4,8,16,32`: the batched engine's concurrency sweep (issue 8).

Full-size Breeze architecture with seeded random weights (or `--model DIR`), end of speech masked, half of
the streams with CFG; per concurrency: aggregate real-time factor, per-stream RTF and TTFA p50 / p95, step
time, peak GPU memory; then (`--agreement-streams N`) the fraction of frames identical batched vs alone.
Prints a table; `--json FILE` writes it all. Reuses the bench's model, precision and device options.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import platform
from pathlib import Path

import torch

from breeze_worker.bench import concurrency as sweep
from breeze_worker.bench.measure import device_name
from breeze_worker.bench.runner import mask_end_of_speech

log = logging.getLogger("breeze_worker.bench")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the sweep, added to `breeze-worker bench` (commands/bench.py)."""
    parser.add_argument("--concurrency", default=None,
                        help="run the batched-engine concurrency sweep instead, e.g. 1,2,4,8,16,32")
    parser.add_argument("--agreement-streams", type=int, default=0,
                        help="with --concurrency: streams for the batched-vs-alone frame agreement (0: skip)")
    parser.add_argument("--batch1-ms", type=float, default=None,
                        help="with --concurrency: the fast path's batch-1 ms per frame to compare the 1-stream row with")


def run(args: argparse.Namespace) -> int:
    from breeze_worker.bench.models import checkpoint_model, random_model
    from breeze_worker.engine.batching import BatchedStepper
    from breeze_worker.engine.precision import choose_policy
    from breeze_worker.engine.runtime import pick_device

    device = pick_device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = False
    levels = [int(n) for n in str(args.concurrency).split(",") if n]
    precision = str(args.precision).split(",")[0]
    policy = choose_policy(precision, device, force=args.force_precision)
    torch.manual_seed(args.seed)
    model = (checkpoint_model(args.model, device, policy) if args.model
             else random_model(args.size, args.seed, device, policy))
    mask_end_of_speech(model)
    t0 = datetime.datetime.now()
    stepper = BatchedStepper(model, max(levels + [args.agreement_streams]), device)
    warmup_s = (datetime.datetime.now() - t0).total_seconds()
    doc = {
        "schema": "breeze-bench-concurrency/1",
        "meta": {"device": device_name(device), "device_type": device.type,
                 "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "commit": args.commit, "torch": torch.__version__, "python": platform.python_version(),
                 "model": args.model or f"random-{args.size}", "precision": policy.name, "frames": args.frames,
                 "seed": args.seed, "max_streams": stepper.max_streams, "graphs": stepper.graphs.graph_count,
                 "graph_fallback": stepper.graphs.fallback_reason, "stepper_build_s": warmup_s,
                 "codec": model.codec is not None},
    }
    if args.agreement_streams:
        doc["agreement"] = sweep.agreement(model, device, streams=args.agreement_streams, frames=min(args.frames, 32),
                                           seed=args.seed, stepper=stepper)
    doc["rows"] = sweep.measure_concurrency(model, device, levels, frames=args.frames, seed=args.seed,
                                            stepper=stepper)
    doc["targets"] = sweep.check_targets(doc["rows"], args.batch1_ms)
    print(sweep.table(doc["rows"]))
    if "agreement" in doc:
        a = doc["agreement"]
        print(f"agreement, {a['streams']} streams batched vs alone: {a['identical_fraction']:.3f} of frames identical; "
              f"first differing frame per stream {a['first_differing_frame']}")
    print("targets:", {k: v for k, v in doc["targets"].items() if k != "targets"})
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0
