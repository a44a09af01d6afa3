"""`breeze-worker bench`: the engine benchmark. Eager reference and fast path in the same run, with and
without CFG, on the full-size Breeze architecture with seeded random weights built on the device (no
download), a smaller size, or a real checkpoint (`--model DIR`). End of speech is masked so every request
runs `--frames` frames. Prints a table; `--json FILE` writes everything (schema in measure/report.py);
`--trace FILE.json` writes a Chrome / Perfetto trace of each variant's first timed request (spans only) and
of its untimed host-sync count request (with a gpu_sync mark at every sync).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import platform
from dataclasses import replace

import torch

from breeze_worker import jsonout
from breeze_worker.measure import report
from breeze_worker.measure.instruments import copy_bandwidth, device_name, software_versions
from breeze_worker.measure.runner import (
    frames_equal,
    instrument_variant,
    make_request,
    mask_end_of_speech,
    time_variant,
)

log = logging.getLogger("breeze_worker.measure")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="checkpoint directory (default: random weights, --size)")
    parser.add_argument("--size", default="full", choices=("full", "mid", "tiny"),
                        help="random-weight model size (full = the released architecture)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--precision", default="auto", help="auto | fp32 | bf16 | fp16-mixed (comma list allowed)")
    parser.add_argument("--force-precision", action="store_true", help="allow a precision this device emulates")
    parser.add_argument("--paths", default="eager,fast",
                        help="decode paths to run: eager, fast (compiled as BREEZE_FASTPATH_COMPILE says: auto = "
                             "on CUDA), fast-uncompiled, fast-compiled")
    parser.add_argument("--capacity", type=int, default=None,
                        help="backbone positions (prompt + frames) the static cache holds (default: the model's)")
    parser.add_argument("--cfg", default="off,on", help="CFG settings to run (off, on)")
    parser.add_argument("--frames", type=int, default=64, help="frames per request (end of speech masked)")
    parser.add_argument("--eager-frames", type=int, default=None, help="frames per eager request (default: --frames)")
    parser.add_argument("--repeats", type=int, default=3, help="timed requests per variant (after one warm-up)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--check", action="store_true", help="also check fast frames == eager frames (FP32 only)")
    parser.add_argument("--agreement", default="", help="policies to compare against fp32 (e.g. fp16-mixed,bf16)")
    parser.add_argument("--commit", default=None, help="commit id to record (default: $BREEZE_COMMIT)")
    jsonout.add_argument(parser, "write every figure as one JSON document to FILE, rewritten after each variant "
                                 "(- for stdout, once at the end; the tables then go to stderr)")
    parser.add_argument("--trace", default=None, metavar="FILE.json",
                        help="Chrome / Perfetto trace of every variant's first timed request and its sync count run")
    from breeze_worker.commands import bench_concurrency  # the --concurrency sweep's options

    bench_concurrency.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "concurrency", None):
        from breeze_worker.commands import bench_concurrency

        return bench_concurrency.run(args)
    from breeze_worker.config import WorkerSettings, recorded_commit
    from breeze_worker.engine.precision import choose_policy
    from breeze_worker.engine.runtime import configure_codec_convolutions, pick_device
    from breeze_worker.measure.models import checkpoint_model, random_model

    device = pick_device(args.device)
    served = WorkerSettings.from_env().engine  # what the worker would serve with (its environment)
    codec_tf32 = configure_codec_convolutions(device, served.codec_tf32)
    fastpath = served.fastpath  # a path may name its own form and sampler
    args.commit = args.commit or recorded_commit()
    torch.manual_seed(args.seed)
    tracer = None
    if args.trace:
        from breeze_worker.engine.tracing import Tracer

        tracer = Tracer(nvtx=device.type == "cuda")
    bandwidth = copy_bandwidth(device)
    doc: dict = {
        "schema": report.SCHEMA,
        "meta": {"device": device_name(device), "device_type": device.type, "codec_tf32": codec_tf32,
                 "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                 "commit": args.commit, **software_versions(device), "python": platform.python_version(),
                 "model": args.model or f"random-{args.size}", "frames": args.frames, "seed": args.seed,
                 "capacity": args.capacity, "eager_frames": args.eager_frames, "repeats": args.repeats},
        "copy_bandwidth_bytes_per_s": bandwidth, "variants": [], "floor": {}, "checks": {}, "agreement": [],
    }
    paths = [p for p in args.paths.split(",") if p]
    cfgs = [c == "on" for c in args.cfg.split(",") if c]
    policies = [choose_policy(p, device, force=args.force_precision) for p in args.precision.split(",") if p]

    def load(policy, first: bool):
        model = (checkpoint_model(args.model, device, policy) if args.model
                 else random_model(args.size, args.seed, device, policy))
        if first and args.agreement and policy.name == "fp32":
            for other in [p for p in args.agreement.split(",") if p]:
                doc["agreement"].append(_agreement(model, other, args))
        if args.capacity:
            model.generation_defaults = replace(model.generation_defaults, max_sequence=args.capacity)
        mask_end_of_speech(model)
        return model

    def unload() -> None:
        from breeze_worker.engine.fastpath.graph import clear_runners

        clear_runners()  # pooled runners hold the model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # pass 1: every timed request of every variant; pass 2: the instrumented requests (host syncs, the
    # profiler). torch.profiler leaves CUPTI attached, which slows every frame after it for the rest of the
    # process (by ~7% on an H200), so nothing is timed after the first profile.
    measured = []  # (policy, frames asked for, variant dict: its path and cfg)
    model = None
    for i, policy in enumerate(policies):
        log.info("precision %s (%s)", policy.name, policy.reason)
        model = load(policy, first=True)
        weights = report.bytes_per_frame(model.lm)
        floor = report.floor_ms(weights["total"], bandwidth)
        doc["floor"][policy.name] = {"bytes_per_frame": weights, "floor_ms": floor}
        results = {}
        for cfg in cfgs:
            for path in paths:
                frames = args.eager_frames if (path == "eager" and args.eager_frames) else args.frames
                name = f"{path}/{'cfg' if cfg else 'nocfg'}/{policy.name}"
                log.info("running %s (%d frames x %d)", name, frames, args.repeats)
                v = time_variant(name, path, cfg, model, device, frames=frames, repeats=args.repeats, seed=args.seed,
                                 tracer=tracer, settings=fastpath)
                v.update(precision=policy.name, floor_ms=floor)
                results[(path, cfg)] = v
                measured.append((policy, frames, v))
                doc["variants"].append(v)
                print(f"[{name}] ms/frame {v['ms_per_frame']} ttfa_ms {v['ttfa_ms']} (lm {v['ttfa_lm_ms']}) "
                      f"first use s {v['first_use_s']} fallback {v['compile_fallback_reason']}", flush=True)
                if jsonout.to_file(args.json):  # a run cut short by a time limit still leaves what it measured
                    report.write_json({**doc, "partial": True}, args.json)
            for path in paths:
                if args.check and path != "eager" and ("eager", cfg) in results and (path, cfg) in results:
                    key = f"{policy.name}/{'cfg' if cfg else 'nocfg'}" + ("" if path == "fast" else f"/{path}")
                    doc["checks"][key] = frames_equal(results[("eager", cfg)]["_frames"],
                                                      results[(path, cfg)]["_frames"])
        if i + 1 < len(policies):  # the last precision's model serves pass 2 first
            model = None
            unload()
    for policy in reversed(policies):
        reloaded = model is None
        if model is None:
            model = load(policy, first=False)
        for p, frames, v in measured:
            if p is policy:
                v.update(instrument_variant(v["name"], v["path"], v["cfg"], model, device, frames=frames,
                                            seed=args.seed, tracer=tracer, warm_up=reloaded, settings=fastpath))
                print(f"[{v['name']}] host syncs/frame {v['host_syncs_per_frame']} busy {v['gpu_busy_fraction']} "
                      f"kernels {v['gpu_kernels_profiled']}", flush=True)
        model = None
        unload()
    doc["targets"] = report.targets(doc["variants"])
    doc["t4_projection"] = _t4(doc)
    print(report.table(doc))
    for key, check in doc["checks"].items():
        print(f"fast == eager [{key}]: {check}")
    for a in doc["agreement"]:
        print(f"agreement {a['policy']} vs fp32: codebook0 {a['codebook0']} codebook1 {a['codebook1']} "
              f"kept_fp32={a['kept_fp32']}")
    if args.json:
        report.write_json(doc, args.json)
    if tracer is not None:
        tracer.write(args.trace, {**doc["meta"], "variants": ",".join(v["name"] for v in doc["variants"])})
        print(f"wrote {args.trace} ({len(tracer.events)} events)")
    failed = [k for k, c in doc["checks"].items() if not c["equal"]]
    if failed:
        log.error("fast path frames differ from the eager reference: %s", failed)
        return 1
    return 0


def _agreement(model, other: str, args) -> dict:
    from breeze_worker.measure.agreement import precision_agreement

    request = make_request(model, True, 4, args.seed)
    return precision_agreement(model, request, other)


def _t4(doc: dict) -> dict:
    """From the fast CFG variant of the half-precision policy measured (fp16-mixed preferred, else bf16)."""
    for precision in ("fp16-mixed", "bf16"):
        fast = min((v for v in doc["variants"] if v["path"] != "eager" and v["cfg"] and v["precision"] == precision
                    and v["ms_per_frame"]), key=lambda v: v["ms_per_frame"], default=None)
        if fast is None:
            continue
        floor = doc["floor"][precision]
        out = report.t4_projection(fast["ms_per_frame"], floor["floor_ms"], floor["bytes_per_frame"]["total"])
        out["from_variant"] = fast["name"]
        return out
    return {}
