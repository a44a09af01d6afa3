"""GPU check and timing of the sampling kernel (engine/fastpath/fused_sampling.py) against the torch sampler it
replaces (engine/sampling.py compiled by Inductor: pairwise filters up to 8 streams, the sort above).

1. correctness, per stream count (1-32) and width (2051 depth classes, 2052 for codebook 0): the kernel's
   kept set == `_sorted_keep`, its codes == `sample_rows` (eager torch), its non-finite flags == isfinite,
   over default settings (top-k 50, top-p 1), nucleus rows, greedy rows and tied logits (2051 classes as a
   head block of 2048 lanes and a tail of 4).
2. launch settings: the kernel's warps, per position in a CUDA graph of 16 calls at 1 and 32 streams, default settings (top-p 1: no nucleus search) and top-p 0.9 on every row;
   the fastest at the default settings (the sum over 1 and 32 streams; the committed plan wins ties
   within 2%) to --best-out as BREEZE_FUSED_CONFIG JSON.
3. time per position: the kernel (chosen settings) vs the compiled torch sampler.

    BREEZE_COMMIT=<sha> PYTHONPATH=worker python3 scripts/gpu_sampling.py --json out.json --best-out best.json
    TRITON_INTERPRET=1 PYTHONPATH=worker python3 scripts/gpu_sampling.py --dry-run   (CPU: part 1 only)
"""

from __future__ import annotations

import argparse
import json

import torch

import gpu_fused
from breeze_worker.engine.fastpath import fused, fused_sampling
from breeze_worker.engine.fastpath.compiled import compile_unit
from breeze_worker.engine.fastpath.settings import FastPathSettings
from breeze_worker.engine.sampling import RowSampling, exponential_noise, filter_rows, sample_rows

DEVICE = "cuda"
CANDIDATES = [{"num_warps": w} for w in (4, 8, 16)]


def rows_for(streams: int, nucleus: bool | None) -> RowSampling:
    """nucleus None: a mix (default rows, top-p 0.9 rows, a greedy row, top-k 0); True/False: every row."""
    top_k = [50] * streams
    top_p = [0.9 if nucleus else 1.0] * streams
    temperature = [0.9] * streams
    if nucleus is None:
        for s in range(streams):
            top_p[s] = (1.0, 0.9, 0.7, 1.0)[s % 4]
            top_k[s] = (50, 50, 0, 7)[s % 4]
        temperature[-1] = 0.0 if streams > 1 else 0.9
    z = dict(device=DEVICE)
    return RowSampling(temperature=torch.tensor(temperature, **z), top_k=torch.tensor(top_k, **z),
                       top_p=torch.tensor(top_p, **z), repetition_penalty=torch.ones(streams, **z),
                       seed=torch.arange(streams, dtype=torch.int64, **z) * 17 + 5)


def inputs(streams: int, vocab: int, seed: int, ties: bool = False):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    logits = torch.randn(streams, vocab, generator=g, device=DEVICE) * 3
    if ties:
        logits = (logits * 2).round() / 2
    blocked = torch.zeros(vocab, dtype=torch.bool, device=DEVICE)
    blocked[2048:2051] = True  # the reserved codes (2051, codebook 0's end of speech, stays open)
    return logits, blocked


def check(streams: int, vocab: int, seed: int, ties: bool) -> dict:
    logits, blocked = inputs(streams, vocab, seed, ties)
    rows = rows_for(streams, None)
    frame = torch.full((streams,), seed, dtype=torch.int64, device=DEVICE)
    noise = exponential_noise(rows.seed, frame, 4, vocab)
    flags = torch.zeros(streams, dtype=torch.bool, device=DEVICE)
    keep = torch.zeros(streams, vocab, dtype=torch.int8, device=DEVICE)
    code = fused_sampling.sample(logits, rows, blocked, torch.log(noise), flags, keep_out=keep)
    same_keep = bool(torch.equal(keep.bool(), filter_rows(logits, rows, blocked)[1]))
    same_code = bool(torch.equal(code, sample_rows(logits, rows, frame, 4, blocked, noise=noise)))
    bad = logits.clone()
    bad[0, 3] = float("nan")
    flags2 = torch.zeros(streams, dtype=torch.bool, device=DEVICE)
    fused_sampling.sample(bad, rows, blocked, torch.log(noise), flags2)
    flags_ok = bool(torch.equal(flags, torch.zeros_like(flags))) and bool(flags2[0]) and not bool(flags2[1:].any())
    return {"streams": streams, "vocab": vocab, "ties": ties, "keep_equal": same_keep, "codes_equal": same_code,
            "flags_ok": flags_ok, "ok": same_keep and same_code and flags_ok}


def _torch_pick(logits, rows, blocked, noise, flags, pairwise: bool):
    flags |= ~torch.isfinite(logits).all(dim=-1)
    return sample_rows(logits, rows, torch.zeros_like(rows.seed), 0, blocked, noise=noise, pairwise=pairwise)


def _timing_inputs(streams: int, vocab: int, nucleus: bool):
    logits, blocked = inputs(streams, vocab, 1)
    rows = rows_for(streams, nucleus)
    noise = exponential_noise(rows.seed, torch.zeros(streams, dtype=torch.int64, device=DEVICE), 1, vocab)
    return logits, blocked, rows, noise, torch.log(noise), torch.zeros(streams, dtype=torch.bool, device=DEVICE)


def tune(vocab: int, candidates: list[dict]) -> tuple[list[dict], dict]:
    """Every candidate at 1 and 32 streams, top-p 1 and 0.9 (us per position); the chosen settings."""
    table = []
    for cfg in candidates + [None]:  # None: the committed plan
        ks = fused.KernelSettings(plans={"sample": cfg} if cfg else {})
        row = {"config": cfg or fused.plan("sample", vocab), "committed": cfg is None}
        try:
            for streams in (1, 32):
                for nucleus in (False, True):
                    logits, blocked, rows, _, log_noise, flags = _timing_inputs(streams, vocab, nucleus)
                    row[f"us_s{streams}_p{'0.9' if nucleus else '1'}"] = gpu_fused.graph_ms(
                        lambda: fused_sampling.sample(logits, rows, blocked, log_noise, flags, kernels=ks),
                        reps=16) * 1000
        except Exception as exc:  # a setting the compiler rejects
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
        if "error" not in row:
            row["default_settings_us"] = row["us_s1_p1"] + row["us_s32_p1"]
        print(json.dumps(row), flush=True)
        table.append(row)
    timed = [r for r in table if "error" not in r]
    committed = next(r for r in timed if r["committed"])
    fastest = min(timed, key=lambda r: r["default_settings_us"])
    chosen = committed if committed["default_settings_us"] <= 1.02 * fastest["default_settings_us"] else fastest
    return table, {"sample": chosen["config"]}


def timing(streams: int, vocab: int, nucleus: bool, ks: fused.KernelSettings) -> dict:
    logits, blocked, rows, noise, log_noise, flags = _timing_inputs(streams, vocab, nucleus)
    pairwise = streams <= 8
    compiled = compile_unit(_torch_pick, FastPathSettings())
    out = {"streams": streams, "vocab": vocab, "top_p": 0.9 if nucleus else 1.0,
           "torch_form": "pairwise" if pairwise else "sorted"}
    out["kernel_us"] = gpu_fused.graph_ms(lambda: fused_sampling.sample(logits, rows, blocked, log_noise, flags,
                                                                        kernels=ks), reps=16) * 1000
    out["torch_us"] = gpu_fused.graph_ms(lambda: compiled(logits, rows, blocked, noise, flags, pairwise),
                                         reps=16) * 1000
    out["speedup"] = out["torch_us"] / out["kernel_us"]
    print(f"S={streams:3d} V={vocab} top_p {out['top_p']}: kernel {out['kernel_us']:6.2f} us, torch "
          f"({out['torch_form']}) {out['torch_us']:6.2f} us: {out['speedup']:.2f}x", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--best-out", help="write the chosen launch settings here (BREEZE_FUSED_CONFIG JSON)")
    parser.add_argument("--dry-run", action="store_true", help="the checks on the CPU (Triton's interpreter)")
    parser.add_argument("--candidates", default=None,
                        help="the launch settings to time instead of the built-in sweep (JSON list of 'sample' settings)")
    args = parser.parse_args()
    global DEVICE
    if args.dry_run:
        DEVICE = "cpu"
    result = {} if args.dry_run else gpu_fused.gpu_result()
    cases = [(1, 2051, False), (2, 2052, False), (8, 2051, True), (16, 2052, False), (32, 2051, True), (48, 2051, False)]
    checks = [check(s, v, seed, ties) for seed, (s, v, ties) in enumerate(cases)]
    for c in checks:
        print(json.dumps(c), flush=True)
    result["checks"] = checks
    result["checks_ok"] = all(c["ok"] for c in checks)
    if args.dry_run:
        return 0 if result["checks_ok"] else 1
    result["tune"], best = tune(2051, json.loads(args.candidates) if args.candidates else CANDIDATES)
    print("best:", json.dumps(best), flush=True)
    if args.best_out:
        with open(args.best_out, "w") as fh:
            json.dump(best if result["checks_ok"] else {}, fh)
    chosen = fused.KernelSettings(plans=best)
    result["timing"] = [timing(s, 2051, nucleus, chosen) for s in (1, 8, 16, 32) for nucleus in (False, True)]
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0 if result["checks_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
