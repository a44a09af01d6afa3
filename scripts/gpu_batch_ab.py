"""Batched layer forms A/B in ONE process (results/batching/NOTES.md runs 19-20: forms compared in separate
processes differ by less than the spread between processes).

One model (full-size architecture, seeded random weights, BF16, end of speech masked, 256 cache slots), one
BatchedStepper per form (its FastPathSettings name the form: compiled units and CUDA graphs of its own), one unrecorded warm-up burst per form, then ROUNDS rounds in which every form runs the same
STREAMS-stream burst (half the streams with CFG, FRAMES frames each, the FP32 codec after each step as the
engine runs it by default), the order rotating each round. Per form: the median over rounds of the burst's
median language-model ms per step, step ms, aggregate and steady x real time; the share of frames equal to
the first form's (BF16: different kernels round differently, then sampling diverges, so this is not expected
to be 1).

    BREEZE_COMMIT=<sha> PYTHONPATH=worker:client:protos:scripts python3 scripts/gpu_batch_ab.py --json ab.json
    PYTHONPATH=worker:client:protos:scripts python3 scripts/gpu_batch_ab.py --json /tmp/ab.json --dry-run  (CPU)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch

import gpu_fused  # scripts/: the JSON skeleton (GPU, date, commit, versions)

from breeze_worker.bench import concurrency as sweep
from breeze_worker.bench.models import random_model
from breeze_worker.bench.runner import mask_end_of_speech
from breeze_worker.engine.batching import BatchedStepper
from breeze_worker.engine.fastpath.fused import KernelSettings
from breeze_worker.engine.fastpath.settings import FastPathSettings, parse_plans
from breeze_worker.engine.precision import choose_policy
from breeze_worker.engine.runtime import configure_codec_convolutions


def build(model, form: str, streams: int, device: torch.device, settings: FastPathSettings,
          fused_config: str | None = None) -> tuple[BatchedStepper, float]:
    """A stepper whose compiled steps use `form`, its kernels launched with `fused_config` (launch-plan overrides,
    BREEZE_FUSED_CONFIG's JSON) on top of `settings`."""
    kernels = KernelSettings(chained=settings.kernels.chained, plans=parse_plans(fused_config or ""))
    t0 = time.perf_counter()
    stepper = BatchedStepper(model, streams, device, shapes=sweep.sweep_shapes(streams, [streams]),
                             settings=settings.with_changes(form=form, kernels=kernels))
    return stepper, time.perf_counter() - t0


def parse_variants(forms: str, variants: list[str]) -> dict[str, tuple[str, str | None]]:
    """label -> (form, BREEZE_FUSED_CONFIG or None): each --variant "label=form" or "label=form|{json}", else
    each of --forms under its own name."""
    if not variants:
        return {f.strip(): (f.strip(), None) for f in forms.split(",") if f.strip()}
    out = {}
    for spec in variants:
        label, _, rest = spec.partition("=")
        form, _, config = rest.partition("|")
        if not label or not form:
            raise SystemExit(f"--variant {spec!r}: want label=form or label=form|{{json}}")
        out[label.strip()] = (form.strip(), config.strip() or None)
    return out


def setup(args, schema: str) -> tuple:
    """(device, streams, fast-path settings, JSON skeleton, model) of a batched-step script: CUDA, the full-size
    architecture with seeded random weights in BF16, `args.streams` streams, the fast path's settings as the
    worker reads them (its environment); with `args.dry_run` the CPU, the tiny model in FP32, at most 2 streams,
    uncompiled. End of speech masked (every
    stream runs its frames), 256 cache slots."""
    device = torch.device("cpu" if args.dry_run else "cuda")
    from breeze_worker.profiling.setup import fastpath_settings

    size, streams = ("tiny", min(args.streams, 2)) if args.dry_run else ("full", args.streams)
    settings = fastpath_settings().with_changes(compile="off") if args.dry_run else fastpath_settings()
    doc = {"schema": schema, **gpu_fused.gpu_result(device.type)}
    configure_codec_convolutions(device)
    policy = choose_policy("fp32" if args.dry_run else "bf16", device)
    model = random_model(size, args.seed, device, policy)
    model.generation_defaults = replace(model.generation_defaults, max_sequence=256)
    mask_end_of_speech(model)
    return device, streams, settings, doc, model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--forms", default="gemm,gemm+attention", help="comma-separated; the first is the baseline")
    parser.add_argument("--variant", action="append", default=[],
                        help='label=form or label=form|{"kernel": {settings}} (repeatable; replaces --forms)')
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, 2 streams, uncompiled: the logic")
    args = parser.parse_args()
    device, streams, settings, doc, model = setup(args, "breeze-batch-ab/1")
    variants = parse_variants(args.forms, args.variant)
    forms = list(variants)
    steppers, build_s = {}, {}
    for form in forms:
        steppers[form], build_s[form] = build(model, variants[form][0], streams, device, settings, variants[form][1])
        print(f"[ab] {form}: stepper built in {build_s[form]:.1f} s ({steppers[form].stats()['compile_s']:.1f} s "
              f"compiling)", flush=True)
    requests = sweep.stream_requests(model, streams, args.frames, args.seed)
    # one unrecorded burst per variant first: a process's first burst ran at ~9x aggregate (runs 21-23; its
    # step medians were normal), which the median over a few rounds does not always hide
    for form in forms:
        sweep.run_burst(steppers[form], model.codec, requests, device, overlap=False)
    per = {form: [] for form in forms}
    frames = {}
    for i in range(args.rounds):
        for form in forms[i % len(forms):] + forms[:i % len(forms)]:
            burst = sweep.run_burst(steppers[form], model.codec, requests, device, overlap=False)
            figures = sweep._burst_figures(burst, streams)
            per[form].append({k: figures[k] for k in ("lm_ms_p50", "step_ms_p50", "codec_ms_p50",
                                                     "aggregate_x_realtime", "steady_x_realtime", "join_ms",
                                                     "first_step_ms")})
            frames.setdefault(form, burst["frames"])
            print(f"[ab] round {i} {form}: LM {figures['lm_ms_p50']:.2f} ms, step {figures['step_ms_p50']:.2f} ms, "
                  f"{figures['aggregate_x_realtime']:.1f}x, join {figures['join_ms']:.1f} ms, first step "
                  f"{figures['first_step_ms']:.1f} ms", flush=True)
    base = forms[0]
    summary = {}
    for form in forms:
        med = {k: statistics.median(r[k] for r in per[form] if r[k] is not None) for k in per[form][0]
               if any(r[k] is not None for r in per[form])}
        pairs = [(a, b) for k in frames[base] for a, b in zip(frames[base][k], frames[form][k])]
        med["frames_equal_to_first"] = sum(bool(torch.equal(a, b)) for a, b in pairs) / max(1, len(pairs))
        med["lm_ratio_to_first"] = med["lm_ms_p50"] / statistics.median(r["lm_ms_p50"] for r in per[base])
        summary[form] = med
        print(f"[ab] {form}: LM {med['lm_ms_p50']:.3f} ms ({med['lm_ratio_to_first']:.3f} of {base}), step "
              f"{med['step_ms_p50']:.2f} ms, {med['aggregate_x_realtime']:.1f}x aggregate, join {med['join_ms']:.1f} "
              f"ms, first step {med['first_step_ms']:.1f} ms, frames equal to {base} "
              f"{100 * med['frames_equal_to_first']:.1f}%", flush=True)
    doc.update({"forms": forms, "variants": {k: list(v) for k, v in variants.items()}, "streams": streams,
                "frames": args.frames, "rounds": args.rounds, "build_s": build_s, "runs": per, "summary": summary})
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
