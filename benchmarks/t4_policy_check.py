#!/usr/bin/env python3
"""The T4 policy check: on any CUDA GPU forced to what a T4 serves (fp16-mixed language model, strict FP32
codec convolutions: no TF32), what the two 16-bit options change, in one JSON and a short table.

1. precision: `precision-check`'s teacher-forced comparison (measure/agreement.py) of fp16-mixed and
   fp16-mixed-kv16 (the backbone's keys and values stored in FP16) against FP32, with CFG, and the FP32
   reference's largest key and value per backbone layer beside the bound its q/k norms put on the keys;
2. the half-precision codec (`--codec-precision fp16-mixed`) against FP32 (measure/codec_precision.py, SNR,
   threshold 40 dB): on the codec goldens (tests/fixtures/codec_golden: codes and the audio the reference
   implementation decoded from them) and on the model's own codec, one-shot and streamed one frame at a time,
   over the teacher frames and random codes;
3. time: the batched engine's step (engine/batching.py, CUDA graphs, end of speech masked, half the streams
   with CFG; uncompiled unless `--compile`) at each of `--streams`, with the backbone's KV cache in FP32 and in
   FP16, median ms a step, the frames of both compared; the codec's streamed step at each of `--codec-rows`
   rows in FP32 and fp16-mixed, median ms a call; the backbone cache's bytes a row and position, allocated;
4. the doctor's projection of a 16 GB T4 before and after both options (doctor/report.py `t4_options`),
   for reference: projected, not measured.

On the CPU (`--device cpu --size tiny`) every part runs on the tiny model and the golden codec (a smoke run of
the tool: its times mean nothing). Writes `--json` (default $OUT/t4_policy_check.json when $OUT is set).

    breeze-worker make-checkpoint --size full /tmp/ckpt
    python benchmarks/t4_policy_check.py --model /tmp/ckpt --device cuda --json $OUT/t4_policy_check.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import bench_env

bench_env.use_source_tree()

GOLDEN = bench_env.ROOT / "tests" / "fixtures" / "codec_golden"
SCHEMA = "breeze-t4-policy-check/1"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmarks/t4_policy_check.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, metavar="DIR",
                        help="checkpoint directory (`breeze-worker make-checkpoint --size full DIR`); default: "
                             "random weights at --size")
    parser.add_argument("--size", default="full", choices=("full", "mid", "tiny"),
                        help="random-weight size without --model")
    parser.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (a smoke run)")
    parser.add_argument("--frames", type=int, default=12, help="teacher-forced frames of the precision check")
    parser.add_argument("--streams", default="1,8,16", help="stream counts the engine's step is timed at")
    parser.add_argument("--codec-rows", default="1,8,16,32", help="row counts the codec's step is timed at")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (and codec calls) per level")
    parser.add_argument("--compile", action="store_true", help="compile the engine's step (minutes more)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--commit", default=None, help="commit id to record")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="where to write the result (default: $OUT/t4_policy_check.json when $OUT is set)")
    args = parser.parse_args(argv)
    args.streams = [int(s) for s in args.streams.split(",") if s]
    args.codec_rows = [int(s) for s in args.codec_rows.split(",") if s]
    if not args.streams or min(args.streams) < 1 or not args.codec_rows or min(args.codec_rows) < 1:
        parser.error("--streams and --codec-rows need positive counts")
    if args.json is None and os.environ.get("OUT"):
        args.json = str(Path(os.environ["OUT"]) / "t4_policy_check.json")
    return args


# ---------------------------------------------------------------- parts


def precision_part(model, args) -> tuple[dict, dict, object]:
    """The teacher-forced check of fp16-mixed and fp16-mixed-kv16; (its figures, the layers fp16-mixed keeps in
    FP32, the teacher codes [N, 16])."""
    from breeze_worker.measure.agreement import precision_check
    from breeze_worker.measure.setup import make_request

    request = make_request(model, "The quick brown fox jumps over the lazy dog, and the weather is clear.", True,
                           args.frames, args.seed)
    codes: list = []
    result = precision_check(model, request, ["fp16-mixed", "fp16-mixed-kv16"], codes_out=codes)
    summary = {p["policy"]: {"summary": p["summary"], "recipe": p["recipe"], "note": p["note"],
                             "kept_fp32": p["kept_fp32"], "emulated": p["emulated"]} for p in result["policies"]}
    return {"frames": result["frames"], "policies": summary, "kv_ranges": result["kv_ranges"]}, \
        result["activation_peaks"], codes[0]


def codec_snr_part(model, teacher, device, seed: int) -> dict:
    """The half codec against FP32 on the goldens and on the model's own codec (teacher frames, random codes)."""
    import numpy as np
    import torch

    from breeze_worker.measure.codec_precision import codec_precision_check
    from breeze_worker.model.codec import load_codec

    golden = dict(np.load(GOLDEN / "golden.npz"))
    golden_codec = load_codec(GOLDEN / "audio_tokenizer", device=device)
    out = {"goldens": codec_precision_check(golden_codec, torch.from_numpy(golden["codes"]),
                                            golden["expected_audio"])}
    if model.codec is None:
        out["model"] = None
        return out
    size = model.codec.codebook_size
    generator = torch.Generator().manual_seed(seed)
    random_codes = torch.randint(0, size, (4, 16, 24), generator=generator)
    out["model_teacher_frames"] = codec_precision_check(model.codec, teacher.t()[None].clamp(max=size - 1))
    out["model_random_codes"] = codec_precision_check(model.codec, random_codes)
    return out


def _median_ms(fn, device, repeats: int) -> float:
    import torch

    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def engine_part(served, device, args) -> dict:
    """The batched step with the backbone's KV cache in FP32 and FP16: ms a step per level, allocated cache
    bytes, and whether both options give the same frames."""
    import dataclasses

    import torch

    from breeze_worker.config import FastPathSettings
    from breeze_worker.engine.batching import BatchedStepper
    from breeze_worker.engine.precision import half_kv_refusal
    from breeze_worker.measure.concurrency import burst_need, stream_requests

    frames_needed = 2 + args.steps + 2
    defaults = served.generation_defaults
    served.generation_defaults = dataclasses.replace(defaults, max_sequence=256)  # one attention bucket to capture
    top = max(args.streams)
    shapes = sorted({burst_need(n) for n in args.streams} | {(1, 2)})
    rows, frames_by_option = [], {}
    try:
        for half_kv in (False, True):
            settings = FastPathSettings(compile="on" if args.compile else "off", half_kv=half_kv)
            stepper = BatchedStepper(served, top, device, eos_masked=True, shapes=shapes, settings=settings)
            cache = stepper.step_buffers.cache
            per_row_position = 2 * cache.key[:, 0, :, 0].numel() * cache.key.element_size()
            for n in args.streams:
                requests = stream_requests(served, n, frames_needed, args.seed)
                keys = [(f"s{i}", r) for i, r in enumerate(requests)]
                refused = stepper.join(keys)
                assert refused == {}, {key: f"{type(e).__name__}: {e}" for key, e in refused.items()}
                got: dict[str, list] = {}

                def step(got=got, stepper=stepper):
                    for key, out in stepper.step().items():
                        if out.error is not None:
                            raise out.error
                        if out.frame is not None:
                            got.setdefault(key, []).append(out.frame)

                step()
                step()
                ms = _median_ms(step, device, args.steps)
                for key, _ in keys:
                    stepper.leave(key)
                    stepper.forget(key)
                frames_by_option[(half_kv, n)] = got
                rows.append({"half_kv": half_kv, "kv_dtype": str(cache.key.dtype).replace("torch.", ""),
                             "streams": n, "rows": burst_need(n)[1], "ms_per_step": ms,
                             "backbone_cache_bytes_per_row_position": per_row_position,
                             "compiled": stepper.stats()["compiled"], "graphs": stepper.stats()["graphs"]})
            del stepper
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        served.generation_defaults = defaults
    agreement = {}
    for n in args.streams:
        a, b = frames_by_option[(False, n)], frames_by_option[(True, n)]
        pairs = [(x, y) for key in a for x, y in zip(a[key], b.get(key, []))]
        agreement[str(n)] = sum(bool(torch.equal(x, y)) for x, y in pairs) / max(1, len(pairs))
    return {"capacity_timed": 256, "compile": args.compile, "rows": rows,
            "identical_frames_fp16_vs_fp32_cache": agreement, "half_kv_refusal": half_kv_refusal(served.lm)}


def codec_time_part(codec, device, rows_list: list[int], repeats: int) -> list[dict]:
    """The codec's streamed one-frame step, FP32 and fp16-mixed, at each row count: median ms a call."""
    import torch

    from breeze_worker.measure.codec_precision import half_copy

    if codec is None:
        return []
    half, _ = half_copy(codec)
    out = []
    generator = torch.Generator().manual_seed(7)
    for name, variant in (("fp32", codec), ("fp16-mixed", half)):
        for rows in rows_list:
            state = variant.new_stream(rows)
            codes = torch.randint(0, variant.codebook_size, (rows, 16, 1), generator=generator).to(variant.device)
            with torch.no_grad():
                variant.decode_stream(codes, state)
                ms = _median_ms(lambda v=variant, c=codes, s=state: v.decode_stream(c, s), device, repeats)
            out.append({"precision": name, "rows": rows, "ms_per_step": ms})
    del half
    return out


# ---------------------------------------------------------------- the run


def served_model(fp32, keep: dict, device):
    """The fp16-mixed model as the worker serves it (the layers the check found near FP16's limit kept FP32),
    built from the FP32 reference (which the check left on the host)."""
    from breeze_worker.measure.agreement import policy_model

    model, _ = policy_model(fp32, "fp16-mixed", keep, device)
    if model.codec is not None:
        model.codec.to(device)
    return model


def table(doc: dict) -> str:
    lines = [f"T4 policy check on {doc['meta']['device']} (fp16-mixed forced, codec strict FP32)"]
    p = doc["precision"]["policies"]
    for name in ("fp16-mixed", "fp16-mixed-kv16"):
        s = p[name]["summary"]
        lines.append(f"  {name:<16} KL mean {s['kl_mean']:.2e}  top-1 {s['top1_agreement']:.3f}  "
                     f"non-finite {s['nonfinite']}")
    r = doc["precision"]["kv_ranges"]
    bounds = [x["key_bound"] for x in r["per_layer"] if x["key_bound"] is not None]
    lines.append(f"  backbone keys <= {r['key_max']:.4g} (norm bound {max(bounds) if bounds else float('nan'):.4g}), "
                 f"values <= {r['value_max']:.4g} (FP16 max 65504)")
    c = doc["codec_snr"]
    for name in ("goldens", "model_teacher_frames", "model_random_codes"):
        if c.get(name):
            lines.append(f"  codec fp16-mixed SNR {name:<22} {c[name]['min_snr_db']:6.1f} dB "
                         f"({'passes' if c[name]['passes'] else 'FAILS'} 40 dB)")
    by = {(r["half_kv"], r["streams"]): r["ms_per_step"] for r in doc["engine"]["rows"]}
    same = doc["engine"]["identical_frames_fp16_vs_fp32_cache"]
    for n in sorted({r["streams"] for r in doc["engine"]["rows"]}):
        lines.append(f"  engine step, {n:>2} streams: FP32 KV {by[(False, n)]:7.2f} ms, FP16 KV "
                     f"{by[(True, n)]:7.2f} ms (same frames: {same[str(n)]:.2f})")
    codec = {(r["precision"], r["rows"]): r["ms_per_step"] for r in doc["codec_time"]}
    for rows in sorted({r["rows"] for r in doc["codec_time"]}):
        lines.append(f"  codec step, {rows:>2} rows: FP32 {codec[('fp32', rows)]:7.2f} ms, fp16-mixed "
                     f"{codec[('fp16-mixed', rows)]:7.2f} ms")
    for o in doc["t4_projection"]:
        lines.append(f"  projected 16 GB T4, {o['option']:<27} slots {o['slots']:>2}, RTF<=0.5 {o['streams_rtf_0_5']}, "
                     f"RTF<=1 {o['streams_rtf_1']:>2}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch

    from breeze_worker.doctor.report import t4_options
    from breeze_worker.engine.runtime import configure_codec_convolutions, pick_device
    from breeze_worker.measure.setup import load_model

    args = parse_args(argv)
    started = time.perf_counter()
    torch.set_grad_enabled(False)
    device = pick_device(args.device)
    configure_codec_convolutions(device, False)  # strict FP32, as on a T4 (no TF32 below compute capability 8.0)
    fp32 = load_model(args, device, precision="fp32")
    config = fp32.config
    meta = {**bench_env.describe(args.commit), "device": torch.cuda.get_device_name(device)
            if device.type == "cuda" else "cpu", "model": args.model or f"random-{args.size}",
            "policy": "fp16-mixed (forced: what a T4 serves)", "codec_convolutions": "strict FP32 (TF32 off)",
            "argv": sys.argv[1:]}
    timings = {}
    t0 = time.perf_counter()
    precision, keep, teacher = precision_part(fp32, args)  # leaves the FP32 language model on the host
    timings["precision_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    codec_snr = codec_snr_part(fp32, teacher, device, args.seed)
    timings["codec_snr_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    served = served_model(fp32, keep, device)
    del fp32
    engine = engine_part(served, device, args)
    timings["engine_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    codec_time = codec_time_part(served.codec, device, args.codec_rows, args.steps)
    timings["codec_time_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - started
    doc = {"schema": SCHEMA, "meta": meta, "precision": precision, "codec_snr": codec_snr, "engine": engine,
           "codec_time": codec_time, "t4_projection": t4_options(config), "timings": timings,
           "t4_projection_note": "projected by the doctor from the H200 reference and T4 datasheet figures "
                                 "(doctor/report.py t4_options), not measured here"}
    if args.json:
        bench_env.write_json(args.json, doc)
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
