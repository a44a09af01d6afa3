"""Where a 32-stream burst's time goes outside its steady steps: the join (text encode + prefill) and the first
steps after it, under torch.profiler; the join's parts timed, and its host synchronizations by where they happen (results/batching/NOTES.md: the join is ~10% of a 48-frame burst and the
first step took ~2x a steady one; neither had been profiled on its own).

One model (full-size architecture, seeded random weights, BF16, end of speech masked, 256 cache slots), the
default batched stepper (compiled), the FP32 codec after each step as the engine runs it. Two unrecorded
bursts warm every shape; then REPEATS joins are timed (host wall, and the join's own split: text encode and
prefill), one join and the first FIRST steps after it are profiled, each on its own: the CPU operators by
self time and the device kernels by total time, and every step's host wall time.

    BREEZE_COMMIT=<sha> PYTHONPATH=worker:client:protos:scripts python3 scripts/gpu_join_profile.py --json j.json
    PYTHONPATH=worker:client:protos:scripts python3 scripts/gpu_join_profile.py --json /tmp/j.json --dry-run  (CPU)
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
import traceback
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_batch_ab import setup  # scripts/: the model and JSON skeleton the batched-step scripts share

from breeze_worker.bench import concurrency as sweep
from breeze_worker.bench.measure import synchronize
from breeze_worker.engine import batching
from breeze_worker.engine.batching import BatchedStepper
from breeze_worker.engine.codec_rows import CodecRows


def top(prof, key: str, n: int) -> list[dict]:
    """The profile's `n` largest entries by `key` ("self_cpu" or "device"), in microseconds."""
    rows = []
    for e in prof.key_averages():
        device_us = getattr(e, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(e, "self_cuda_time_total", 0.0)
        rows.append({"name": e.key[:120], "count": e.count, "self_cpu_us": e.self_cpu_time_total,
                     "device_us": device_us})
    rows.sort(key=lambda r: r["self_cpu_us" if key == "self_cpu" else "device_us"], reverse=True)
    return rows[:n]


def show(title: str, rows: list[dict]) -> None:
    print(title, flush=True)
    for r in rows:
        print(f"  cpu {r['self_cpu_us'] / 1000:8.2f} ms  device {r['device_us'] / 1000:8.2f} ms  x{r['count']:<6} "
              f"{r['name']}", flush=True)


def phases(stepper, model, join, device: torch.device) -> dict:
    """One join with its parts timed (tokenizing, the text encoder, each joiner's prompt embeddings, the
    prefill), the device synchronized after each part: the wrappers replace the functions batching.py calls
    for this join only."""
    spent = collections.defaultdict(float)

    def timed(name, fn):
        def run(*args, **kwargs):
            synchronize(device)
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                synchronize(device)
                spent[name] += 1000 * (time.perf_counter() - t)
        return run

    saved = {name: getattr(batching, name) for name in ("prompt_layouts", "prompt_text_segments",
                                                        "prepare_prompt_embeddings")}
    for name, fn in saved.items():
        setattr(batching, name, timed(name, fn))
    stepper._prefill = timed("prefill", stepper._prefill)
    encode = model.lm.encode_segments
    model.lm.encode_segments = timed("encode_segments", encode)
    try:
        spent["join_wall"] = join()["wall_ms"]
    finally:
        for name, fn in saved.items():
            setattr(batching, name, fn)
        del stepper._prefill
        model.lm.encode_segments = encode
    return dict(spent)


def sync_sites(fn) -> dict:
    """Every host synchronization during `fn()` (torch.cuda.set_sync_debug_mode), counted by the innermost
    frame of this repository's code that caused it."""
    sites = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        ours = [f for f in traceback.extract_stack()[:-1] if "breeze_worker" in f.filename]
        where = ours[-1] if ours else None
        sites[f"{where.filename.split('breeze_worker/')[-1]}:{where.lineno} {where.name}" if where
              else f"{filename}:{lineno}"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return dict(sites)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--first", type=int, default=3, help="steps after the join to profile")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, 2 streams, uncompiled: the logic")
    args = parser.parse_args()
    device, streams, settings, doc, model = setup(args, "breeze-join-profile/1")
    t0 = time.perf_counter()
    stepper = BatchedStepper(model, streams, device, shapes=sweep.sweep_shapes(streams, [streams]), settings=settings)
    doc["build_s"] = time.perf_counter() - t0
    requests = sweep.stream_requests(model, streams, 48, args.seed)
    for _ in range(2):  # every shape warm: the stepper's buckets, the codec's slot batch, the allocator
        sweep.run_burst(stepper, model.codec, requests, device, overlap=False)
    keys = list(range(streams))
    rows = CodecRows(model.codec)

    def join() -> dict:
        synchronize(device)
        t = time.perf_counter()
        errors = stepper.join(list(zip(keys, requests)))
        synchronize(device)
        if errors:
            raise RuntimeError(f"join failed: {errors}")
        info = stepper.stream_info(keys[0])
        return {"wall_ms": 1000 * (time.perf_counter() - t), "text_encode_ms": 1000 * info["text_encode_s"],
                "prefill_ms": 1000 * info["prefill_s"]}

    def step() -> float:
        t = time.perf_counter()
        outcomes = stepper.step()
        frames = {k: out.frame for k, out in outcomes.items() if out.frame is not None}
        rows.launch(frames).wait()
        return 1000 * (time.perf_counter() - t)

    def leave_all() -> None:
        for k in keys:
            stepper.leave(k)
        rows.remove_all(keys)

    joins = []
    for _ in range(args.repeats):
        joins.append(join())
        rows.add_all(keys)
        joins[-1]["steps_ms"] = [step() for _ in range(args.first + 2)]
        leave_all()
    doc["joins"] = joins
    print("joins:", json.dumps(joins), flush=True)
    print(f"join median {statistics.median(j['wall_ms'] for j in joins):.1f} ms (text encode "
          f"{statistics.median(j['text_encode_ms'] for j in joins):.1f}, prefill "
          f"{statistics.median(j['prefill_ms'] for j in joins):.1f})", flush=True)

    doc["phases_ms"] = phases(stepper, model, join, device)
    print("join phases (ms, device synchronized after each):", json.dumps(doc["phases_ms"]), flush=True)
    leave_all()
    if device.type == "cuda":
        doc["join_syncs"] = sync_sites(join)
        print(f"host syncs in one join: {sum(doc['join_syncs'].values())}", flush=True)
        for site, n in sorted(doc["join_syncs"].items(), key=lambda kv: -kv[1])[:15]:
            print(f"  x{n:<5} {site}", flush=True)
        leave_all()

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        joined = join()
    rows.add_all(keys)
    doc["profiled_join"] = {**joined, "by_cpu": top(prof, "self_cpu", 25), "by_device": top(prof, "device", 25)}
    show(f"join ({joined['wall_ms']:.1f} ms) by self CPU time:", doc["profiled_join"]["by_cpu"])
    show("join by device time:", doc["profiled_join"]["by_device"])
    doc["profiled_steps"] = []
    for i in range(args.first):
        with profile(activities=activities) as prof:
            ms = step()
        entry = {"step": i, "wall_ms": ms, "by_cpu": top(prof, "self_cpu", 12), "by_device": top(prof, "device", 12)}
        doc["profiled_steps"].append(entry)
        show(f"step {i} after the join ({ms:.1f} ms) by self CPU time:", entry["by_cpu"])
        show(f"step {i} by device time:", entry["by_device"])
    leave_all()
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
