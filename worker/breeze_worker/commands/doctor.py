"""`breeze-worker doctor`: what this host can do with Breeze TTS 2, measured where it can be, and what to do next.

On a CUDA GPU it measures (within `--budget-s`) copy bandwidth, the model's byte floor, the worker's start-up,
memory per stream, a batch-1 fast-path probe and a precision check against FP32, then prints the verdict:
RTF at batch 1, the streams that keep RTF <= 0.5, the stop condition and what to do next. On the CPU it
reports what it can tell (device, versions, the precision `auto` picks and why, projections from this
project's recorded figures) and what it could not measure. It never changes the host or the model.

    breeze-worker doctor --device cuda --json doctor.json --price-per-hour 0.526
    breeze-worker doctor --price-per-hour T4=0.526        # the cost table: add CLASS=PRICE for each class you rent

Exit status: 0 the report is complete for this device (on the CPU: the report above); 2 bad flags or model;
3 a GPU probe was not measured (busy, too small, time budget, or failed: the report says which and why).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

import torch

from breeze_worker import jsonout

EXIT_OK, EXIT_USAGE, EXIT_INCOMPLETE = 0, 2, 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, metavar="DIR",
                        help="checkpoint directory (default: the architecture at --size with seeded random weights)")
    parser.add_argument("--size", default="full", choices=("full", "mid", "tiny"),
                        help="random-weight model size without --model (full = the released architecture)")
    parser.add_argument("--device", default="auto",
                        help="auto | cpu | cuda | cuda:N (auto: the first GPU, else the CPU)")
    jsonout.add_argument(parser, "write the report as one JSON document (schema breeze-doctor/1) to FILE (- for "
                                 "stdout; the text report then goes to stderr)")
    parser.add_argument("--price-per-hour", default=None, metavar="X|CLASS=X,...",
                        help="hourly price of this host's GPU (a number), and/or of GPU classes for the cost table "
                             "(T4=0.526,L4=0.80,...)")
    parser.add_argument("--gpu-class", default="T4",
                        help="the GPU class the verdict speaks for when no GPU is measured (default: T4)")
    parser.add_argument("--budget-s", type=float, default=170.0,
                        help="seconds the GPU probes may take; a probe with too little left is reported as not "
                             "measured (default: 170)")
    parser.add_argument("--frames", type=int, default=48,
                        help="frames per fast-path probe request, 2 to 128 (default: 48)")
    parser.add_argument("--allow-busy", action="store_true",
                        help="measure even when other processes use the GPU (their work skews every figure)")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the random weights and of sampling")
    parser.add_argument("--commit", default=None, help="commit id to record in the report")


def parse_prices(text: str | None) -> tuple[float | None, dict[str, float]]:
    """`X` (this host), `CLASS=X,...` (the cost table's classes), or both: (host price, prices by class name)."""
    from breeze_worker.doctor.figures import gpu_class

    host, by_class = None, {}
    for part in [p.strip() for p in (text or "").split(",") if p.strip()]:
        name, eq, value = part.rpartition("=")
        try:
            price = float(value)
        except ValueError:
            raise ValueError(f"--price-per-hour: {part!r} is not a price (X or CLASS=X)") from None
        if price <= 0:
            raise ValueError(f"--price-per-hour: a price must be positive, not {value}")
        if eq:
            by_class[gpu_class(name).name] = price
        elif host is not None:
            raise ValueError("--price-per-hour: give one bare price (this host's); name the others CLASS=X")
        else:
            host = price
    return host, by_class


def _validate(args: argparse.Namespace):
    from breeze_worker.doctor.figures import gpu_class
    from breeze_worker.doctor.probes import ModelSpec

    if args.budget_s <= 0:
        raise ValueError(f"--budget-s must be positive, not {args.budget_s}")
    if not 2 <= args.frames <= 128:
        raise ValueError(f"--frames must be 2 to 128 (the first frame carries the prompt; the probe's cache holds "
                         f"256 positions), not {args.frames}")
    host_price, prices = parse_prices(args.price_per_hour)
    subject_class = gpu_class(args.gpu_class)
    spec = ModelSpec(model_dir=args.model, size=args.size, seed=args.seed)
    return spec, spec.config(), subject_class, host_price, prices


def run(args: argparse.Namespace) -> int:
    from breeze_worker.doctor.sandbox import private_caches

    started = time.perf_counter()
    torch.set_grad_enabled(False)
    with private_caches():  # everything, the report included: importing the compilers can touch their caches
        try:
            spec, config, subject_class, host_price, prices = _validate(args)
        except ValueError as exc:
            print(f"breeze-worker doctor: {exc}", file=sys.stderr)
            return EXIT_USAGE
        return _doctor(args, spec, config, subject_class, host_price, prices, started)


def _doctor(args: argparse.Namespace, spec, config, subject_class, host_price: float | None,
            prices: dict[str, float], started: float) -> int:
    from breeze_worker.config import WorkerSettings
    from breeze_worker.doctor import facts as device_facts
    from breeze_worker.doctor import report
    from breeze_worker.doctor.figures import class_of_device
    from breeze_worker.doctor.probes import PROBES, MeasureOptions, measure
    from breeze_worker.doctor.verdict import policy_for
    from breeze_worker.engine.runtime import configure_codec_convolutions, pick_device

    smi = device_facts.sample_smi() if args.device != "cpu" and torch.cuda.is_available() else None
    try:
        device = pick_device(args.device)
    except ValueError as exc:
        print(f"breeze-worker doctor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if device.type == "cuda":
        facts = device_facts.cuda_facts(device, smi)
        configure_codec_convolutions(device, WorkerSettings.from_env().engine.codec_tf32)  # as the worker serves
        policy = policy_for(facts.capability)
        options = MeasureOptions(frames=args.frames, budget_s=args.budget_s, allow_busy=args.allow_busy)
        measured, missing = measure(device, spec, policy, busy_reasons=facts.busy_reasons, options=options)
    else:
        facts = device_facts.cpu_facts()
        policy = policy_for(None)
        measured, missing = {}, {name: "no CUDA device: a GPU figure" for name in PROBES}
    fig, subject, context = _subject(facts, measured, policy, config, subject_class)
    if host_price is None and fig is not None:
        host_price = prices.get(fig.device) or prices.get(getattr(class_of_device(facts.name), "name", ""))
    meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": args.commit, "model": spec.label, "seed": spec.seed, "device_requested": args.device,
            "budget_s": args.budget_s, "frames": args.frames, "elapsed_s": time.perf_counter() - started,
            "writes": "only --json; compiler caches went to a temporary directory, removed"}
    policy_doc = report.policy_section(facts.capability, facts.bf16_supported_with_emulation)
    policy_doc["kept_fp32"] = (measured.get("load") or {}).get("kept_fp32", [])
    doc = report.build(meta=meta, facts=facts, policy=policy_doc, config=config, measured=measured, missing=missing,
                       subject_figures=fig, context=context, subject=subject, prices=prices, host_price=host_price)
    code = exit_code(device.type, missing)
    doc["exit_code"] = code
    print(report.text(doc))
    if args.json:
        report.write_json(doc, args.json)
    return code


def exit_code(device_type: str, missing: dict[str, str]) -> int:
    """0: complete for this device (the CPU's report never measures); 3: a GPU probe was not measured."""
    return EXIT_OK if device_type != "cuda" or not missing else EXIT_INCOMPLETE


def _subject(facts, measured: dict, policy: str, config, subject_class):
    """The figures the verdict speaks for, its name, and the host context."""
    from breeze_worker.doctor.figures import class_of_device
    from breeze_worker.doctor.report import class_figures, host_figures
    from breeze_worker.doctor.verdict import HostContext

    precision = measured.get("precision") or {}
    serving = next((p for p in precision.get("policies", []) if p["policy"] == policy), None)
    nonfinite = None if not serving or not serving.get("summary") else serving["summary"]["nonfinite"] > 0
    startup = measured.get("startup") or {}
    context = HostContext(busy=facts.busy, emulates_bf16=facts.emulates_bf16, nonfinite=nonfinite,
                          startup_s=startup.get("total_s"), compile_s=startup.get("compile_s"))
    fig = host_figures(facts, measured, policy, config) if facts.type == "cuda" else None
    if fig is not None:
        return fig, f"this host, {facts.name}: measured at batch 1, batched steps projected", context
    cls = class_of_device(facts.name) if facts.type == "cuda" else subject_class
    if cls is None:
        return None, f"this host, {facts.name}", context
    projected = next(f for f in class_figures(config) if f.device == cls.name)
    where = ("no GPU here; --gpu-class picks another class" if facts.type != "cuda"
             else "the fast path was not measured on this host")
    context = HostContext(busy=context.busy, emulates_bf16=cls.capability < (8, 0), measured=False)
    return projected, f"a {cls.name}, projected from recorded figures ({where})", context
