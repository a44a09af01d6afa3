"""GPU check and timing of the depth attention inside the q/k/v kernel (engine/fastpath/fused.py
`qkv_rope_attend`, the "qkv_rope" plan's `attend`) against the committed chain (the q/k/v kernel, then the
attention kernel), at the full-size depth decoder's shapes, 12 layers of seeded random weights.

1. checks, FP32 and BF16, rows x positions (1, 1), (2, 1), (2, 2), (4, 2), (8, 1): the "fused+chain" form's
   output and written cache entries with `attend` against the same form without it (both kernels) and
   against the torch stages; repeated runs bit-identical (the arrival counters reset), chained launches
   and unchained bit-identical.
2. the layer step of "fused+chain" without `attend` and with it at three launch settings (VARIANTS) in CUDA
   graphs of the 12 layers, at 2 x 1 (batch 1 with CFG) and 2 x 2 (the depth prefill), alternated over
   --rounds; median us a step.

    BREEZE_COMMIT=<sha> PYTHONPATH=worker:client:protos python3 scripts/gpu_attend.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import gpu_fused  # scripts/: Depth, run_fused, rel, graph_ms, gpu_result

from breeze_worker.engine.fastpath import fused

ATTEND = {"qkv_rope": {"attend": True}}
# the layer step's variants: label -> launch-plan overrides ("chain" the committed plans)
VARIANTS = {"chain": {}, "attend": ATTEND, "attend_w4": {"qkv_rope": {"attend": True, "num_warps": 4}},
            "attend_p2": {"qkv_rope": {"attend": True, "block_p": 2}}}


@torch.no_grad()
def check(depth: gpu_fused.Depth, rows: int, t: int, start: int) -> dict:
    gen = torch.Generator(device=gpu_fused.DEVICE).manual_seed(rows * 100 + t)
    x = torch.randn(rows, t, depth.cfg.hidden_size, generator=gen, device=gpu_fused.DEVICE).to(depth.dtype)
    stale = depth.caches(rows, seed=7)
    results = {}
    for mode in ("chain", "attend", "attend-again", "attend-unchained", "torch"):
        caches = [(k.clone(), v.clone()) for k, v in stale]
        fused._config_override = ATTEND if mode.startswith("attend") else {}
        fused._use_kernels = False if mode == "torch" else None
        fused._pdl_override = False if mode == "attend-unchained" else None
        y = gpu_fused.run_fused(depth, x, start, caches, fused.DownWorkspace(), form="fused+chain")
        written = torch.cat([torch.cat([k[:, :, start:start + t], v[:, :, start:start + t]]) for k, v in caches])
        results[mode] = (y, written)
    fused._config_override, fused._use_kernels, fused._pdl_override = {}, None, None
    out = {"rows": rows, "t": t, "start": start, "dtype": str(depth.dtype).replace("torch.", "")}
    out["attend_vs_chain_out"] = gpu_fused.rel(results["attend"][0], results["chain"][0])
    out["attend_vs_torch_out"] = gpu_fused.rel(results["attend"][0], results["torch"][0])
    out["chain_vs_torch_out"] = gpu_fused.rel(results["chain"][0], results["torch"][0])
    out["attend_vs_chain_cache"] = gpu_fused.rel(results["attend"][1], results["chain"][1])
    out["attend_identical_to_chain"] = bool(torch.equal(results["attend"][0], results["chain"][0]))
    out["repeat_identical"] = bool(torch.equal(results["attend"][0], results["attend-again"][0]))
    out["pdl_identical"] = bool(torch.equal(results["attend"][0], results["attend-unchained"][0]))
    out["finite"] = bool(torch.isfinite(results["attend"][0]).all())
    bound = 1e-5 if depth.dtype == torch.float32 else 2e-2
    out["ok"] = (out["finite"] and out["repeat_identical"] and out["pdl_identical"]
                 and out["attend_vs_chain_cache"] <= bound
                 and out["attend_vs_torch_out"] <= max(bound, 2 * out["chain_vs_torch_out"]))
    return out


@torch.no_grad()
def layer_steps(depth: gpu_fused.Depth, rounds: int) -> list[dict]:
    out = []
    n = len(depth.layers)
    for rows, t, start in ((2, 1, 5), (2, 2, 0)):
        gen = torch.Generator(device=gpu_fused.DEVICE).manual_seed(11)
        x = torch.randn(rows, t, depth.cfg.hidden_size, generator=gen, device=gpu_fused.DEVICE).to(depth.dtype)
        caches = depth.caches(rows, seed=9)
        workspace = fused.DownWorkspace()
        labels = list(VARIANTS)
        times = {label: [] for label in labels}
        for i in range(rounds):  # the order rotates each round
            for label in labels[i % len(labels):] + labels[:i % len(labels)]:
                fused._config_override = VARIANTS[label]
                times[label].append(1000 * gpu_fused.graph_ms(
                    lambda: gpu_fused.run_fused(depth, x, start, caches, workspace, form="fused+chain")) / n)
        fused._config_override = {}
        row = {"rows": rows, "t": t, "pdl": fused.pdl(torch.device(gpu_fused.DEVICE)),
               **{f"{label}_us": statistics.median(v) for label, v in times.items()},
               "runs_us": times}
        row["ratio_to_chain"] = {label: row[f"{label}_us"] / row["chain_us"] for label in labels}
        print(json.dumps({k: v for k, v in row.items() if k != "runs_us"}), flush=True)
        out.append(row)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, TRITON_INTERPRET=1: the checks on the tiny config's depth layers")
    args = parser.parse_args()
    cases = ((1, 1, 5), (2, 1, 9), (2, 2, 0), (4, 2, 0), (8, 1, 2))
    if args.dry_run:
        gpu_fused.DEVICE = "cpu"
        rows = [check(gpu_fused.Depth(dtype, layers=2, size="tiny"), r, t, s)
                for dtype in (torch.float32, torch.bfloat16) for r, t, s in cases[1:3]]
        for row in rows:
            print(json.dumps(row), flush=True)
        return 0 if all(r["ok"] for r in rows) else 1
    assert fused.available(torch.device("cuda")), "Triton kernels not available"
    result = {"schema": "breeze-attend/1", **gpu_fused.gpu_result()}
    checks = []
    for dtype in (torch.float32, torch.bfloat16):
        depth = gpu_fused.Depth(dtype)
        for r, t, s in cases:
            row = check(depth, r, t, s)
            print(json.dumps(row), flush=True)
            checks.append(row)
        del depth
    result["checks"] = checks
    result["checks_ok"] = all(c["ok"] for c in checks)
    result["layer_steps"] = layer_steps(gpu_fused.Depth(torch.bfloat16), args.rounds)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=1)
    print("checks ok" if result["checks_ok"] else "ERROR: an attend check failed", flush=True)
    return 0 if result["checks_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
