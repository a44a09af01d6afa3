"""GPU comparison of ways to run the full-size codec step (issue 8: the 32-slot codec step took 33.9 ms,
two thirds of the batched step; results/batching/NOTES.md run 2).

Per bucket (--buckets, default 1,8,32) and variant (--variants, default all), one captured `SlotBatch`
(engine/codec_graphs.py) on the full-size decoder with seeded random weights (--size tiny: the tiny codec):
  fp32-library     true FP32, every convolution through cuDNN (benchmark mode at capture): the engine
                   before per-shape convolution forms (run 2 of results/batching/NOTES.md measured 33.6 ms
                   at 32 slots, two thirds of it in one FFT convolution)
  fp32-tuned       true FP32, each one-group (transposed) convolution timed as cuDNN and as one GEMM at
                   this bucket's shape, the faster captured (engine/codec_graphs.py `tune_convolutions`; the default)
  tf32-library     TF32 convolutions (the worker's `codec_tf32` setting), all through cuDNN
  tf32-tuned       TF32 cuDNN convolutions or FP32 GEMMs, whichever is faster per shape
  fp32-tuned-compiled, tf32-tuned-compiled
                   the tuned forms with the step through torch.compile before capture (the worker's
                   `codec_compile` setting; Inductor by default, --compile-backend), so the element-wise
                   kernels fuse; each row reports its compile seconds (compile_s) apart from capture_s
Measured: ms per step (codes up, one replay, audio to the host) with every slot active, median of
--repeats; the same frames decoded by each variant from the same start, compared with fp32-library:
max abs difference and SNR in dB (10 log10 of signal energy over difference energy; inf when equal).
Each tuned row keeps its per-convolution report. Then the kernels of one step at the largest bucket in
true FP32 (torch.profiler, top 15 by device time): eager with the library's and the tuned forms, and,
when a compiled variant ran, compiled with the tuned forms. Prints a table last; --json writes everything.
Usage: PYTHONPATH=worker:client:protos python3 scripts/gpu_codec_variants.py --json out.json
CPU smoke run of the script itself (no graphs, no tuning; Dynamo tracing without code generation):
       PYTHONPATH=worker python3 scripts/gpu_codec_variants.py --device cpu --size tiny --buckets 1,2 \
           --repeats 2 --compile-backend aot_eager
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
from breeze_worker.engine.codec_graphs import SlotBatch, clear_convolution_forms, tune_convolutions
from breeze_worker.model.codec import tiny_codec

# name -> (TF32 convolutions, per-shape forms tuned, compiled)
VARIANTS = {"fp32-library": (False, False, False), "fp32-tuned": (False, True, False),
            "tf32-library": (True, False, False), "tf32-tuned": (True, True, False),
            "fp32-tuned-compiled": (False, True, True), "tf32-tuned-compiled": (True, True, True)}
REFERENCE = "fp32-library"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def frames_for(rows: int, frames: int, seed: int, device: torch.device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = [torch.randint(0, 2048, (rows, 16), generator=g) for _ in range(frames)]
    return [f.pin_memory() for f in out] if device.type == "cuda" else out


def run_variant(decoder, rows: int, tf32: bool, tune: bool, compile: bool, frames: list[torch.Tensor],
                repeats: int, backend: str) -> dict:
    clear_convolution_forms(decoder)
    batch = SlotBatch(decoder, rows, benchmark=True, tf32=tf32, tune=tune, compile=compile, compile_backend=backend)
    audio = [batch.step(f).cpu() for f in frames]  # from silence: the same start for every variant
    times = []
    for i in range(repeats):
        sync(decoder.device)
        t0 = time.perf_counter()
        batch.step(frames[i % len(frames)]).cpu()
        times.append(1000 * (time.perf_counter() - t0))
    return {"graphed": batch.graphed, "compiled": batch.compiled, "fallback_reason": batch.fallback_reason,
            "capture_s": batch.capture_s, "compile_s": batch.compile_s, "ms_per_step": statistics.median(times),
            "ms_min": min(times), "audio": torch.stack(audio),
            "gemm_convs": sum(c["gemm"] for c in batch.conv_tuning), "conv_tuning": batch.conv_tuning}


def compare(audio: torch.Tensor, reference: torch.Tensor) -> dict:
    diff = (audio.double() - reference.double())
    noise = float((diff ** 2).sum())
    signal = float((reference.double() ** 2).sum())
    return {"max_abs_diff": float(diff.abs().max()),
            "snr_db": math.inf if noise == 0 else 10 * math.log10(signal / noise),
            "nonfinite": int((~torch.isfinite(audio)).sum())}


def kernel_profile(decoder, rows: int, tuned: bool, top: int = 15, compiled_with: str | None = None) -> list[dict]:
    """The costliest kernels of one step, eager (or, `compiled_with` a backend, compiled: no graph)."""
    from torch.profiler import ProfilerActivity, profile

    device = decoder.device
    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    state = decoder.new_stream(rows)
    codes = torch.randint(0, 2048, (rows, 16, 1), device=decoder.device)
    clear_convolution_forms(decoder)
    with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=False), \
            torch.inference_mode():
        if tuned:
            tune_convolutions(decoder, lambda: decoder.decode_stream(codes, state))
        if compiled_with is None:
            def step():
                return decoder.decode_stream(codes, state)
        else:  # compiled with the forms just tuned
            batch = SlotBatch(decoder, rows, use_graphs=False, compile=True, compile_backend=compiled_with)
            batch.codes.copy_(codes)
            step = batch.advance
        for _ in range(2):
            step()
        sync(device)
        with profile(activities=[activity]) as prof:
            step()
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
    parser.add_argument("--size", choices=("full", "tiny"), default="full",
                        help="the full-size decoder (random weights), or the tiny codec for a smoke run")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, from {', '.join(VARIANTS)} ({REFERENCE} always runs)")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend of the compiled variants (aot_eager: a quick CPU smoke run)")
    args = parser.parse_args()
    names = [n for n in args.variants.split(",") if n]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    variants = {n: VARIANTS[n] for n in VARIANTS if n in names or n == REFERENCE}
    device = torch.device(args.device)
    if args.size == "tiny":
        decoder = tiny_codec(seed=0, device=device).decoder
    else:
        decoder = decoder_only_codec(seed=0, device=device).decoder
    flops = 5.0e9 if args.size == "full" else None  # per frame per stream, full size (scripts/codec_flops.py)
    out = {"schema": "breeze-codec-variants/1",
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": args.commit,
           "size": args.size, "compile_backend": args.compile_backend,
           "gflop_per_frame_per_stream": flops / 1e9 if flops else None, "rows": []}
    for rows in [int(b) for b in args.buckets.split(",") if b]:
        frames = frames_for(rows, args.frames, seed=rows, device=device)
        results = {name: run_variant(decoder, rows, tf32, tune, compile, frames, args.repeats, args.compile_backend)
                   for name, (tf32, tune, compile) in variants.items()}
        reference = results[REFERENCE]["audio"]
        for name, r in results.items():
            row = {"rows": rows, "variant": name, **{k: v for k, v in r.items() if k != "audio"},
                   **compare(r["audio"], reference),
                   "tflop_per_s": rows * flops / (r["ms_per_step"] / 1000) / 1e12 if flops else math.nan}
            out["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "conv_tuning"}), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
    largest = max(int(b) for b in args.buckets.split(",") if b)
    out["kernels_eager_fp32"] = {"rows": largest, "library": kernel_profile(decoder, largest, tuned=False),
                                 "tuned": kernel_profile(decoder, largest, tuned=True)}
    if any(compile for _, _, compile in variants.values()):
        out["kernels_compiled_fp32"] = {"rows": largest, "tuned": kernel_profile(
            decoder, largest, tuned=True, compiled_with=args.compile_backend)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    print(f"{'rows':>4} {'variant':>19} {'ms/step':>8} {'TFLOP/s':>8} {'SNR dB':>8} {'max diff':>9} "
          f"{'GEMMs':>5} {'compile s':>9} graphed")
    for r in out["rows"]:
        compiled = f"{r['compile_s']:>9.1f}" if r["compiled"] else f"{'-':>9}"
        print(f"{r['rows']:>4} {r['variant']:>19} {r['ms_per_step']:>8.2f} {r['tflop_per_s']:>8.1f} "
              f"{r['snr_db']:>8.1f} {r['max_abs_diff']:>9.2e} {r['gemm_convs']:>5} {compiled} {r['graphed']}")
    tuned = next((r for r in out["rows"] if r["rows"] == largest and r["variant"] == "fp32-tuned"), None)
    if tuned is not None:
        print(f"convolutions at {largest} slots, FP32 (largest library time first):")
        for c in sorted(tuned["conv_tuning"], key=lambda c: -c["library_us"])[:12]:
            print(f"  {c['conv']:<34} {str(c['shape']):>18} library {c['library_us']:8.0f} us  gemm "
                  f"{c['gemm_us']:8.0f} us  -> {'gemm' if c['gemm'] else 'library'}")
    profiles = [("eager", form, out["kernels_eager_fp32"][form]) for form in ("library", "tuned")]
    if "kernels_compiled_fp32" in out:
        profiles.append(("compiled", "tuned", out["kernels_compiled_fp32"]["tuned"]))
    for kind, form, kernels in profiles:
        print(f"{kind} step kernels ({largest} slots, FP32, {form} forms):")
        for k in kernels:
            print(f"  {k['share']:6.1%} {k['us']:9.0f} us x{k['calls']:<4} {k['kernel']}")


if __name__ == "__main__":
    main()
