"""`breeze-worker precision-check [--model DIR]`: teacher-forced frames through each precision policy
against an FP32 reference; per-step KL divergence, top-k agreement and non-finite counts, so a user can
decide on their own checkpoint whether `fp16-mixed` is safe for them (method: measure/agreement.py).

    breeze-worker precision-check --model /ckpt/Breeze-TTS-2 --frames 32 --json precision.json
"""

from __future__ import annotations

import argparse
import datetime
import sys

import torch

from breeze_worker import jsonout
from breeze_worker.errors import BreezeError
from breeze_worker.measure.setup import add_model_arguments, add_request_arguments, device_meta


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, precision=False)
    add_request_arguments(parser, frames=16)
    parser.add_argument("--policies", default="fp32,bf16,fp16-mixed,fp16-mixed-kv16,fp16",
                        help="policies to compare with FP32 (fp32 checks the reference against itself; "
                             "fp16-mixed-kv16: fp16-mixed with the backbone's keys and values stored in FP16)")
    parser.add_argument("--top-k", type=int, default=50, help="k of the top-k agreement (the sampler's default)")
    parser.add_argument("--per-step", action="store_true", help="also print every step of every policy")
    parser.add_argument("--massive-activation", type=float, default=None, metavar="SCALE",
                        help="stress test: multiply the first backbone MLP's gate and up projections by SCALE "
                             "(inner activations grow ~SCALE^2, like a trained model's massive activations) to see "
                             "where plain FP16 overflows and what fp16-mixed keeps in FP32")
    parser.add_argument("--codec", action="store_true",
                        help="also decode the teacher frames with the codec in fp32 and in fp16-mixed (FP16 "
                             "convolutions), one-shot and streamed, and report the SNR against FP32 (the "
                             "--codec-precision fp16-mixed check; threshold 40 dB)")
    jsonout.add_argument(parser)


def check(args: argparse.Namespace) -> dict:
    from breeze_worker.config import WorkerSettings
    from breeze_worker.engine.runtime import configure_codec_convolutions, pick_device
    from breeze_worker.measure.agreement import POLICIES, SCHEMA, precision_check
    from breeze_worker.measure.setup import load_model, make_request

    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"--policies: unknown {', '.join(unknown)} (known: {', '.join(POLICIES)})")
    if args.frames < 1:
        raise ValueError(f"--frames must be at least 1, not {args.frames}")
    if args.top_k < 1:
        raise ValueError(f"--top-k must be at least 1, not {args.top_k}")
    if args.massive_activation is not None and not args.massive_activation > 0:
        raise ValueError(f"--massive-activation must be positive, not {args.massive_activation}")
    device = pick_device(args.device)
    configure_codec_convolutions(device, WorkerSettings.from_env().engine.codec_tf32)  # as the worker serves
    model = load_model(args, device, precision="fp32")
    injected = None
    if args.massive_activation is not None:
        from breeze_worker.measure.agreement import inject_massive_activation

        injected = inject_massive_activation(model, args.massive_activation)
    request = make_request(model, args.text, args.cfg, args.frames, args.seed)
    if args.codec and model.codec is None:
        raise ValueError("--codec: this model has no codec to check")
    codes: list = []
    result = precision_check(model, request, policies, top_k=args.top_k, codes_out=codes)
    if args.codec:
        from breeze_worker.measure.codec_precision import codec_precision_check

        result["codec"] = codec_precision_check(model.codec, codes[0].t()[None])
    meta = {**device_meta(device), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "model": args.model or f"random-{args.size}", "reference": "fp32", "cfg": bool(args.cfg),
            "cfg_scale": request.cfg_scale, "seed": args.seed, "text": args.text,
            "teacher": "the FP32 model's own frames (eager path, end of speech masked)",
            "massive_activation": injected}
    return {"schema": SCHEMA, "meta": meta, **result}


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(doc: dict, per_step: bool = False) -> str:
    top_k = f"top-{doc['top_k']}"
    head = f"{'policy':<12}{'KL mean':>11}{'KL max':>11}{'top-1':>8}{top_k:>8}{'non-finite':>12}  note"
    lines = [f"{doc['frames']} teacher-forced frames x 16 codebooks on {doc['meta']['device']}, vs fp32", head,
             "-" * len(head)]
    injected = doc["meta"].get("massive_activation")
    if injected:
        lines.insert(0, f"stress test: {', '.join(injected['scaled'])} x {injected['scale']:g}")
    for p in doc["policies"]:
        if not p["applied"]:
            lines.append(f"{p['policy']:<12}  not applied: {p['error']}")
            continue
        s = p["summary"]
        notes = [n for n in (p["recipe"] if p["emulated"] else None, p["note"]) if n]
        lines.append(f"{p['policy']:<12}{_f(s['kl_mean'], '.3e'):>11}{_f(s['kl_max'], '.3e'):>11}"
                     f"{s['top1_agreement']:>8.3f}{s['topk_overlap']:>8.3f}{s['nonfinite']:>12}  {'; '.join(notes)}")
        if p["kept_fp32"]:
            lines.append(f"{'':<12}kept in FP32 (overflow on the FP32 reference): {', '.join(p['kept_fp32'])}")
        if per_step:
            for step in p["per_step"]:
                lines.append(f"{'  frame ' + str(step['frame']):<12}{_f(step['kl_mean'], '.3e'):>11}"
                             f"{_f(step['kl_max'], '.3e'):>11}{step['top1_agreement']:>8.3f}"
                             f"{step['topk_overlap']:>8.3f}{step['nonfinite']:>12}")
    ranges = doc.get("kv_ranges")
    if ranges:
        bounds = [r["key_bound"] for r in ranges["per_layer"] if r["key_bound"] is not None]
        lines.append(f"FP32 reference backbone cache: keys up to {ranges['key_max']:.4g} (the q/k norms bound them at "
                     f"{max(bounds):.4g}), values up to {ranges['value_max']:.4g}; FP16's limit "
                     f"{ranges['fp16_limit']:.0f}" if bounds else
                     f"FP32 reference backbone cache: keys up to {ranges['key_max']:.4g}, values up to "
                     f"{ranges['value_max']:.4g}; FP16's limit {ranges['fp16_limit']:.0f}")
    codec = doc.get("codec")
    if codec:
        snr = codec["snr_db"]
        lines.append(f"codec fp16-mixed vs fp32 ({codec['frames']} frames, {codec['fp16_convolutions']} FP16 "
                     f"convolutions): SNR one-shot {min(snr['one_shot']):.1f} dB, streamed {min(snr['streamed']):.1f} "
                     f"dB; {'passes' if codec['passes'] else 'FAILS'} the {codec['threshold_db']:.0f} dB threshold")
    peaks = doc.get("activation_peaks") or {}
    if peaks:
        lines.append(f"FP32 reference: {len(peaks)} linear layers read or write values within 4x of the FP16 limit "
                     f"({doc['fp16_limit']:.0f}): " + ", ".join(f"{n} ({v:.3g})" for n, v in peaks.items()))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    torch.set_grad_enabled(False)
    try:
        doc = check(args)
    except (BreezeError, ValueError) as exc:  # a bad flag, checkpoint or request: one line, usage exit
        print(f"breeze-worker precision-check: {exc}", file=sys.stderr)
        return 2
    print(table(doc, args.per_step))
    jsonout.write(doc, args.json)
    return 0
