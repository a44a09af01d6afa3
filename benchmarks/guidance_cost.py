#!/usr/bin/env python3
"""The cost of guidance branches on the fast path: a request's prompt branches are model rows (one without
guidance, two with one scale, three with voice direction's two scales), and this measures what they cost.

- batch 1: milliseconds per 80 ms frame of the fast path (`breeze-worker bench`'s figure: the median
  inter-frame time from frame 2 on, codec excluded) for a plain request (1 row), an instruction with CFG
  (2 rows) and, where the tree serves it, voice direction with two guidance scales (3 rows);
- 32 streams (`--streams`) at once in the batched engine, a burst: every fourth stream (from the first) voice
  direction over a 4 s reference, every other even one an instruction with CFG, the odd ones plain. Once with the
  direction streams on one guidance scale (2 rows each; 48 rows in all) and, where the tree serves it, on two
  (3 rows; 56 rows): aggregate real time (audio seconds over the burst's wall time, its join included), the
  steady rate (streams x 80 ms over the median step) and the median step. The language model only (the codec's
  cost does not depend on the rows; `--codec` adds it as the worker runs it).

Each source tree runs in a process of its own, this checkout first, then with `--tree` another one (a baseline
without two-scale guidance: `git archive <commit> worker client protos | tar -x -C DIR`), each under a share of
`--budget-s`; a process cut short keeps what it measured. End of speech is masked, so every request runs
`--frames` frames. `--json` gets both trees' figures with the GPU, versions and commit; a short table comes last.

    python benchmarks/guidance_cost.py --device cuda --size full --tree bench-trees/base --json OUT/guidance.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench_env import ROOT, describe, pythonpath_for, use_source_tree, write_json

REFERENCE_FRAMES = 50  # a 4 s reference clip (random codes: the weights are random too)
INSTRUCTION = "Speak clearly and naturally."
TEXT = "The quick brown fox jumps over the lazy dog, and the weather today is bright and clear."


# ---- the measuring process (runs against whichever source tree is first on its path) ----

def _requests(model, kind: str, n: int, frames: int, seed: int) -> list:
    """`n` requests: kind plain, cfg or dual at batch 1 (n = 1); for a burst `single` or `dual`, the mix of the
    module doc with the direction streams on one or two guidance scales."""
    import numpy as np

    from breeze_worker.engine.request import resolve_request
    from breeze_worker.engine.types import ReferenceInput, ResolvedReference, SynthesisRequest

    codes = np.random.RandomState(seed).randint(0, 2048, (REFERENCE_FRAMES, 16))
    reference = ResolvedReference("ref-bench", "a reference line of about four seconds", codes,
                                  REFERENCE_FRAMES / 12.5)
    out = []
    for i in range(n):
        role = kind if n == 1 else ("direct" if i % 4 == 0 else "cfg" if i % 2 == 0 else "plain")
        fields: dict = {}
        ref = None
        if role == "cfg":
            fields = dict(instruction=INSTRUCTION, cfg_scale=2.0)
        elif role in ("dual", "direct"):
            ref = reference
            fields = dict(instruction=INSTRUCTION, reference=ReferenceInput(reference_id=ref.reference_id))
            if role == "dual" or kind == "dual":
                fields.update(cfg_scale_reference=1.5, cfg_scale_instruction=2.0)
            else:
                fields.update(cfg_scale=2.0)
        req = SynthesisRequest(text=TEXT, seed=seed + i, max_frames=frames, **fields)
        out.append(resolve_request(req, model.generation_defaults, ref, tokenizer=model.tokenizer))
    return out


def _rows(requests) -> int:
    return sum(getattr(q, "branches", 2 if q.uses_cfg else 1) for q in requests)


def _batch1(model, device, kind: str, frames: int, repeats: int, seed: int, settings) -> dict:
    from breeze_worker.measure.runner import run_once

    [request] = _requests(model, kind, 1, frames, seed)
    t0 = time.perf_counter()
    run_once("fast", model, request, device, settings=settings)  # first use: compile and capture
    first_use = time.perf_counter() - t0
    runs = [run_once("fast", model, request, device, settings=settings) for _ in range(repeats)]
    per_run = [statistics.median(r.frame_times_s) for r in runs if r.frame_times_s]
    return {"rows": _rows([request]), "frames": len(runs[0].frames), "repeats": repeats,
            "ms_per_frame": 1000 * statistics.median(per_run) if per_run else None,
            "ms_per_frame_runs": [1000 * v for v in per_run],
            "ttfa_lm_ms": 1000 * statistics.median(r.ttfa_lm_s for r in runs), "first_use_s": first_use}


def _burst(stepper, codec, requests, device) -> dict:
    from breeze_worker.measure.concurrency import run_burst

    r = run_burst(stepper, codec, requests, device)
    audio = sum(len(f) for f in r["frames"].values()) / 12.5
    steady = r["step_times_s"][1:] or r["step_times_s"]
    step_ms = 1000 * statistics.median(steady)
    return {"aggregate_x_realtime": audio / r["wall_s"], "steady_x_realtime": len(requests) / 12.5 / (step_ms / 1000),
            "step_ms_p50": step_ms, "join_ms": 1000 * r["join_s"], "wall_s": r["wall_s"],
            "frames": sorted({len(f) for f in r["frames"].values()}),
            "lm_ms_p50": statistics.median(r["lm_ms"][1:] or r["lm_ms"]) if r["lm_ms"] else None}


def measure(args) -> dict:
    """Every figure of this process's source tree; rewritten to `args.part` after each one."""
    import torch

    from breeze_worker.config import WorkerSettings
    from breeze_worker.engine.batching import BatchedStepper, bucket_shapes, pick_shape
    from breeze_worker.engine.precision import choose_policy
    from breeze_worker.engine.runtime import codec_compile_slots, configure_codec_convolutions, pick_device
    from breeze_worker.engine.types import SynthesisRequest
    from breeze_worker.measure.models import random_model
    from breeze_worker.measure.runner import mask_end_of_speech

    device = pick_device(args.device)
    served = WorkerSettings.from_env().engine
    configure_codec_convolutions(device, served.codec_tf32)
    policy = choose_policy(args.precision, device)
    torch.manual_seed(args.seed)
    model = random_model(args.size, args.seed, device, policy, with_codec=args.codec)
    model.generation_defaults = replace(model.generation_defaults, max_sequence=args.capacity)
    mask_end_of_speech(model)
    dual = "cfg_scale_reference" in SynthesisRequest.__dataclass_fields__
    doc: dict = {"source": str(Path(sys.modules["breeze_worker"].__file__).parents[2]), "dual_cfg_served": dual,
                 "precision": policy.name, "batch1": {}, "bursts": {}}

    def save() -> None:
        Path(args.part).write_text(json.dumps(doc, indent=1, default=str))

    lm_only = replace(model, codec=None)
    for kind in ("plain", "cfg", "dual") if dual else ("plain", "cfg"):
        doc["batch1"][kind] = _batch1(lm_only, device, kind, args.frames, args.repeats, args.seed, served.fastpath)
        print(f"batch 1 {kind}: {doc['batch1'][kind]['ms_per_frame']:.2f} ms/frame", file=sys.stderr, flush=True)
        save()
    mixes = {mix: _requests(model, mix, args.streams, args.frames, args.seed) for mix in
             (("single", "dual") if dual else ("single",))}
    shapes = sorted({pick_shape(bucket_shapes(args.streams), args.streams, _rows(reqs)) or (args.streams,
                                                                                           _rows(reqs))
                     for reqs in mixes.values()})
    t0 = time.perf_counter()
    if args.codec and model.codec is not None:
        from breeze_worker.engine.codec_graphs import pool_for

        pool_for(model.codec, compile_from=codec_compile_slots(served, device))
    stepper = BatchedStepper(model, args.streams, device, shapes=shapes, settings=served.fastpath, eos_masked=True)
    doc["stepper"] = {"shapes": [list(s) for s in shapes], "build_s": time.perf_counter() - t0,
                      "compiled": stepper.stats()["compiled"], "compile_fallback": stepper.stats()["compile_fallback"]}
    save()
    codec = model.codec if args.codec else None
    for mix, requests in mixes.items():
        warm = _requests(model, mix, args.streams, 2, args.seed + 1000)
        _burst(stepper, codec, warm, device)
        doc["bursts"][mix] = {"streams": len(requests), "rows": _rows(requests), "codec": codec is not None,
                              **_burst(stepper, codec, requests, device)}
        print(f"{args.streams} streams, {mix}: {doc['bursts'][mix]['aggregate_x_realtime']:.1f}x real time",
              file=sys.stderr, flush=True)
        save()
    return doc


# ---- the parent: one process per tree, then the table ----

def _run_tree(tree: Path | None, args, budget_s: float) -> dict:
    """This script in `--measure` mode against `tree` (None: this checkout) within `budget_s`; its figures,
    those it had when cut short included."""
    part = Path(args.scratch) / f"part-{'this' if tree is None else 'other'}.json"
    part.unlink(missing_ok=True)
    argv = [sys.executable, __file__, "--measure", "--part", str(part), *args.passed]
    env = dict(os.environ, PYTHONPATH=pythonpath_for(tree if tree is not None else ROOT, None),
               PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    timed_out = False
    try:
        proc.wait(timeout=max(1.0, budget_s))
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, 9)
        proc.wait()
    figures = json.loads(part.read_text()) if part.exists() else {}
    return {**figures, "tree": str(tree) if tree is not None else "this checkout", "returncode": proc.returncode,
            "timed_out": timed_out, "seconds": time.perf_counter() - t0}


def _cell(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratios(tree: dict) -> dict:
    """Within one tree: what the third row costs at batch 1, and the bursts' steady rates two scales / one."""
    b1, bursts = tree.get("batch1", {}), tree.get("bursts", {})

    def over(a, b):
        return a / b if a is not None and b else None

    return {"batch 1 ms/frame 3 rows / 2 rows": over((b1.get("dual") or {}).get("ms_per_frame"),
                                                     (b1.get("cfg") or {}).get("ms_per_frame")),
            "steady x real time two scales / one scale": over((bursts.get("dual") or {}).get("steady_x_realtime"),
                                                              (bursts.get("single") or {}).get("steady_x_realtime"))}


def table(doc: dict) -> str:
    this, other = doc["this checkout"], doc.get("other tree") or {}
    names = ("this checkout", "other tree" if other else None)
    lines = [f"guidance cost on {doc['meta'].get('gpu') or doc['device']} ({this.get('precision')}, {doc['size']}, "
             f"{doc['frames']} frames; other tree: {doc['tree'] or '-'})",
             f"{'':44} {'this':>9} {'other':>9} {'this/other':>10}"]

    def row(label: str, get, digits: int = 2) -> None:
        a, b = get(this), (get(other) if other else None)
        ratio = a / b if a is not None and b else None
        lines.append(f"{label:44} {_cell(a, digits):>9} {_cell(b, digits):>9} {_cell(ratio):>10}")

    for kind, label in (("plain", "batch 1 ms/frame, 1 row (plain)"), ("cfg", "batch 1 ms/frame, 2 rows (CFG)"),
                        ("dual", "batch 1 ms/frame, 3 rows (two scales)")):
        row(label, lambda t, k=kind: (t.get("batch1", {}).get(k) or {}).get("ms_per_frame"))
    for mix, label in (("single", "one scale"), ("dual", "two scales")):
        rows = next((t["bursts"][mix]["rows"] for t in (this, other) if mix in t.get("bursts", {})), "-")
        lines.append(f"{doc['streams']} streams, every 4th direction on {label} ({rows} rows)")
        for key, what, digits in (("aggregate_x_realtime", "aggregate x real time (join included)", 1),
                                  ("steady_x_realtime", "steady x real time", 1), ("step_ms_p50", "step ms p50", 2)):
            row(f"  {what}", lambda t, m=mix, k=key: (t.get("bursts", {}).get(m) or {}).get(k), digits)
    for what, ratio in ratios(this).items():
        lines.append(f"this checkout, {what}: {_cell(ratio)}")
    for name in filter(None, names):
        t = doc[name]
        lines.append(f"{name}: {t['seconds']:.0f} s{', cut short' if t['timed_out'] else ''}"
                     f"{', exit ' + str(t['returncode']) if t['returncode'] else ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/guidance_cost.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    p.add_argument("--size", default="full", choices=("full", "mid", "tiny"))
    p.add_argument("--precision", default="auto", help="auto (bf16 on a GPU of compute capability 8.0 or more)")
    p.add_argument("--frames", type=int, default=48, help="frames per request (end of speech masked)")
    p.add_argument("--repeats", type=int, default=3, help="timed batch-1 requests per kind, after one warm-up")
    p.add_argument("--streams", type=int, default=32, help="streams of the burst")
    p.add_argument("--capacity", type=int, default=384, help="backbone positions the static cache holds")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--codec", action="store_true", help="decode the bursts' frames too, as the worker does")
    p.add_argument("--tree", default=None, help="another source tree to measure after this checkout (a baseline)")
    p.add_argument("--budget-s", type=float, default=270.0,
                   help="seconds for both trees; this checkout gets its share (--share) first")
    p.add_argument("--share", type=float, default=0.55, help="this checkout's share of the budget with --tree")
    p.add_argument("--json", default=None, help="write both trees' figures here")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:
        measure(args)
        return 0
    use_source_tree()
    args.passed = ["--device", args.device, "--size", args.size, "--precision", args.precision, "--frames",
                   str(args.frames), "--repeats", str(args.repeats), "--streams", str(args.streams), "--capacity",
                   str(args.capacity), "--seed", str(args.seed), *(["--codec"] if args.codec else [])]
    scratch = Path(args.json).parent if args.json else Path.cwd()
    scratch.mkdir(parents=True, exist_ok=True)
    args.scratch = str(scratch)
    t0 = time.perf_counter()
    doc: dict = {"schema": "breeze-guidance-cost/1", "meta": describe(), "device": args.device, "size": args.size,
                 "frames": args.frames, "streams": args.streams, "capacity": args.capacity, "codec": args.codec,
                 "tree": args.tree}
    doc["this checkout"] = _run_tree(None, args, args.budget_s * (args.share if args.tree else 1.0))
    if args.tree:
        doc["other tree"] = _run_tree(Path(args.tree), args, args.budget_s - (time.perf_counter() - t0))
    doc["this_checkout_ratios"] = ratios(doc["this checkout"])
    for name in ("this", "other"):
        (scratch / f"part-{name}.json").unlink(missing_ok=True)
    if args.json:
        write_json(args.json, doc)
    print(table(doc), flush=True)
    complete = all(not doc[n]["timed_out"] and doc[n]["returncode"] == 0
                   for n in ("this checkout", "other tree") if n in doc)
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
