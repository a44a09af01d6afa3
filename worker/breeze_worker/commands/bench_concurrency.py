"""`breeze-worker bench --concurrency 1,2,4,8,16,32`: the batched engine's concurrency sweep.

Full-size Breeze architecture with seeded random weights (or `--model DIR`), end of speech masked, half of
the streams with CFG; per concurrency: aggregate real-time factor, per-stream RTF and TTFA p50 / p95, step
time split into the language model's and the codec's, the LM step without the codec, peak GPU memory;
then (`--agreement-streams N`) the fraction of frames identical batched vs alone, for each prefill mode of
`--agreement-prefill`; then (`--batch1`) the batch-1 fast path's ms per frame on the same model, for the
1-stream row's comparison. The stepper runs with the fast path's settings as the worker would (its
environment: it compiles its bucket shapes when BREEZE_FASTPATH_COMPILE says so, by default on CUDA); its build
time (compile + capture) is in `meta.stepper`.
Prints a table; `--json FILE` writes it all, rewritten after each phase (a run cut short keeps what it
measured). Reuses the bench's model, precision, device and `--capacity` options.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from breeze_worker import jsonout
from breeze_worker.config import WorkerSettings, recorded_commit
from breeze_worker.measure import concurrency as sweep
from breeze_worker.measure.instruments import device_name, software_versions
from breeze_worker.measure.runner import mask_end_of_speech

log = logging.getLogger("breeze_worker.measure")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the sweep, added to `breeze-worker bench` (commands/bench.py)."""
    parser.add_argument("--concurrency", default=None,
                        help="run the batched-engine concurrency sweep instead, e.g. 1,2,4,8,16,32")
    parser.add_argument("--agreement-streams", type=int, default=0,
                        help="with --concurrency: streams for the batched-vs-alone frame agreement (0: skip)")
    parser.add_argument("--agreement-prefill", default="batched",
                        help="with --agreement-streams: joiners' prefill modes to measure, comma list of batched "
                             "(one text-encoder call and prefill for all joiners) and per-stream (each on its own)")
    parser.add_argument("--batch1-ms", type=float, default=None,
                        help="with --concurrency: the fast path's batch-1 ms per frame to compare the 1-stream "
                             "row with")
    parser.add_argument("--batch1", action="store_true",
                        help="with --concurrency: measure the batch-1 fast path (CFG on, no codec) on the same model "
                             "and compare the 1-stream row with it (overrides --batch1-ms)")
    parser.add_argument("--compare-overlap", action="store_true",
                        help="with --concurrency: run each burst with the codec overlap on and off "
                             "(the default is the worker's: BREEZE_ENGINE_CODEC_OVERLAP)")
    parser.add_argument("--profile-streams", type=int, default=0,
                        help="with --concurrency: after the sweep, profile one burst of this many streams without the "
                             "codec (16 frames, join included) and list its kernels by device time (0: skip)")
    parser.add_argument("--stall-dump-s", type=float, default=5.0,
                        help="with --concurrency: a join or step still running after this many seconds dumps every "
                             "thread's stack to stderr (0: never)")
    parser.add_argument("--text", default=None,
                        help="with --concurrency: every stream speaks this text (default: the sweep's own lines)")
    parser.add_argument("--clone-every", type=int, default=0,
                        help="with --concurrency: every Nth stream, from the first, clones --reference (0: none)")
    parser.add_argument("--reference", default=None, help="with --clone-every: reference audio (a WAV or FLAC file)")
    parser.add_argument("--reference-text", default=None, help="with --clone-every: its exact transcript")
    parser.add_argument("--batch-shapes", default="all", choices=("all", "sweep"),
                        help="with --concurrency: build every bucket shape of the engine (all) or only those this "
                             "run's bursts land in (sweep: less start-up, the same shape per step)")


def run(args: argparse.Namespace) -> int:
    from breeze_worker.engine.batching import BatchedStepper
    from breeze_worker.engine.codec_graphs import pool_for
    from breeze_worker.engine.precision import choose_policy
    from breeze_worker.engine.runtime import codec_compile_slots, configure_codec_convolutions, pick_device
    from breeze_worker.measure.models import checkpoint_model, random_model

    device = pick_device(args.device)
    served = WorkerSettings.from_env().engine  # what the worker would serve with (its environment)
    codec_tf32 = configure_codec_convolutions(device, served.codec_tf32)
    args.commit = args.commit or recorded_commit()
    levels = [int(n) for n in str(args.concurrency).split(",") if n]
    modes = [m.strip() for m in str(args.agreement_prefill).split(",") if m.strip()]
    unknown = [m for m in modes if m not in ("batched", "per-stream")]
    if unknown:
        raise SystemExit(f"--agreement-prefill: unknown mode(s) {unknown}; use batched and/or per-stream")
    precision = str(args.precision).split(",")[0]
    policy = choose_policy(precision, device, force=args.force_precision)
    torch.manual_seed(args.seed)
    model = (checkpoint_model(args.model, device, policy) if args.model
             else random_model(args.size, args.seed, device, policy))
    if args.capacity:
        model.generation_defaults = replace(model.generation_defaults, max_sequence=args.capacity)
    mask_end_of_speech(model)
    mix = _mix(args, model)
    max_streams = max(levels + [args.agreement_streams])
    shapes = (sweep.sweep_shapes(max_streams, levels, args.agreement_streams) if args.batch_shapes == "sweep"
              else None)
    t0 = time.perf_counter()
    fastpath = served.fastpath
    compile_from = codec_compile_slots(served, device)
    if model.codec is not None:  # the codec's slot batches built as the worker builds them (compiled or not)
        pool_for(model.codec, compile_from=compile_from)
    stepper = BatchedStepper(model, max_streams, device, shapes=shapes, settings=fastpath)
    build_s = time.perf_counter() - t0
    stats = stepper.stats()
    log.info("batched stepper: %d shapes, compiled %s, compile %.1f s, capture %.1f s, built in %.1f s",
             len(stats["shapes"]), stats["compiled"], stats["compile_s"], stats["capture_s"], build_s)
    meta: dict[str, object] = {
        "device": device_name(device), "device_type": device.type,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": args.commit, **software_versions(device), "python": platform.python_version(),
        "model": args.model or f"random-{args.size}", "precision": policy.name, "frames": args.frames,
        "seed": args.seed, "capacity": model.generation_defaults.max_sequence,
        "max_streams": stepper.max_streams, "graphs": stats["graphs"],
        "graph_fallback": stats["graph_fallback"], "compile_fallback": stats["compile_fallback"],
        "compiled": stats["compiled"], "stepper_build_s": build_s, "batch_shapes": args.batch_shapes,
        "stepper": stats, "codec": model.codec is not None, "codec_overlap": served.codec_overlap,
        "codec_tf32": codec_tf32, "codec_compile_slots": compile_from,
        "mix": {"text": mix.text, "clone_every": mix.clone_every, "reference_seconds":
                mix.reference.seconds if mix.reference is not None else None}}
    doc: dict[str, object] = {"schema": "breeze-bench-concurrency/2", "meta": meta}

    def save(rows=None) -> None:
        if rows is not None:
            doc["rows"] = rows
        if jsonout.to_file(args.json):  # rewritten after each phase; `--json -` gets the document once, at the end
            jsonout.write(doc, args.json)

    rows = doc["rows"] = sweep.measure_concurrency(model, device, levels, frames=args.frames, seed=args.seed,
                                                   stepper=stepper, compare_overlap=args.compare_overlap,
                                                   codec_overlap=served.codec_overlap, on_row=save,
                                                   stall_dump_s=args.stall_dump_s or None, mix=mix)
    print(sweep.table(rows), flush=True)
    batch1_ms, source = args.batch1_ms, ("--batch1-ms" if args.batch1_ms is not None else None)
    targets = doc["targets"] = sweep.check_targets(rows, batch1_ms, source)
    save()
    if args.batch1:  # before the agreement: the targets compare the 1-stream row with it
        batch1 = doc["batch1"] = _batch1(model, device, args.frames, args.seed, fastpath)
        batch1_ms, source = batch1["ms_per_frame"], "measured in this run"
        targets = doc["targets"] = sweep.check_targets(rows, batch1_ms, source)
        save()
    one = next((r for r in rows if r["streams"] == 1), None)
    if one is not None:
        print(f"1 stream: LM {_fmt(one.get('lm_only_step_ms_p50'))} ms/frame without the codec "
              f"(step with codec {one['step_ms_p50']:.2f} ms: LM {_fmt(one.get('lm_ms_p50'))} + codec "
              f"{_fmt(one.get('codec_ms_p50'))}); batch-1 fast path: {_fmt(batch1_ms)} ms/frame ({source})")
    print("targets:", {k: v for k, v in targets.items() if k != "targets"}, flush=True)
    if args.profile_streams:
        doc["lm_profile"] = _profile(model, stepper, device, args.profile_streams, args.seed)
        save()
    if args.agreement_streams:
        frames = min(args.frames, 32)
        requests = sweep.stream_requests(model, args.agreement_streams, frames, args.seed)
        alone = sweep.alone_frames(stepper, requests, device)
        for mode in modes:
            key = "agreement" if mode == "batched" else "agreement_per_stream_prefill"
            a = doc[key] = sweep.agreement(model, device, streams=args.agreement_streams, frames=frames,
                                           seed=args.seed, stepper=stepper, batch_joins=mode == "batched", alone=alone)
            print(f"agreement ({mode} prefill), {a['streams']} streams batched vs alone: "
                  f"{a['identical_fraction']:.3f} of frames identical; first differing frame per stream "
                  f"{a['first_differing_frame']}", flush=True)
            save()
    meta["stepper"] = stepper.stats()
    save()
    return 0


def _mix(args: argparse.Namespace, model) -> sweep.StreamMix:
    """The streams' text and clones from the options; the reference is encoded as the worker encodes one."""
    if not args.clone_every:
        return sweep.StreamMix(text=args.text)
    if not args.reference or not args.reference_text or model.codec is None:
        raise SystemExit("--clone-every needs --reference, --reference-text and a model with its codec")
    from breeze_worker.engine.reference import ReferenceStore

    reference = ReferenceStore(model.codec).intake(Path(args.reference).read_bytes(), args.reference_text)
    return sweep.StreamMix(text=args.text, clone_every=args.clone_every, reference=reference)


def _profile(model, stepper, device: torch.device, streams: int, seed: int, frames: int = 16) -> dict:
    """One codec-less burst of `streams` streams under torch.profiler: busy fraction and kernels by time."""
    from breeze_worker.measure.instruments import gpu_busy_fraction

    requests = sweep.stream_requests(model, streams, frames, seed)
    profiled = gpu_busy_fraction(device, lambda: sweep.run_burst(stepper, None, requests, device))
    out = {"streams": streams, "frames": frames, **profiled}
    if profiled["top_kernels"]:
        print(f"kernels of one {streams}-stream burst without the codec ({frames} frames, join included; busy "
              f"{profiled['busy_fraction']:.2f}, {profiled['kernels']} kernels):")
        for k in profiled["top_kernels"][:20]:
            print(f"  {k['total_us'] / frames:9.1f} us/frame x{k['count'] / frames:<7.1f} {k['name']}")
    return out


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _batch1(model, device: torch.device, frames: int, seed: int, settings, repeats: int = 2) -> dict:
    """The batch-1 fast path (engine/fastpath, with the fast path's `settings`), CFG on, no codec: the median
    inter-frame time over `repeats` requests after one warm-up."""
    from breeze_worker.measure.runner import make_request, run_once

    lm_only = replace(model, codec=None)
    request = make_request(lm_only, True, frames, seed)
    t0 = time.perf_counter()
    warm = run_once("fast", lm_only, request, device, settings=settings)
    first_use_s = time.perf_counter() - t0
    runs = [run_once("fast", lm_only, request, device, settings=settings) for _ in range(repeats)]
    per_frame = [statistics.median(r.frame_times_s) for r in runs if r.frame_times_s]
    return {"ms_per_frame": 1000 * statistics.median(per_frame) if per_frame else None, "cfg": True,
            "frames": len(runs[0].frames), "repeats": repeats, "compiled": warm.compiled,
            "compile_fallback_reason": warm.compile_fallback_reason, "graph_fallback_reason": warm.fallback_reason,
            "first_use_s": first_use_s}
