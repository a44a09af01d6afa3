"""Run by tests/fastpath/test_fused.py in a subprocess with TRITON_INTERPRET=1: the batched MLP kernels
(engine/fastpath/fused_rows.py) executed by Triton's interpreter on CPU tensors against the same stages in
torch, at shrunk shapes: row counts inside one row tile and over several, masked columns, K split in 1-3
chunks, FP32 (IEEE products) and FP16 weights. Prints one JSON line per case; exits non-zero on a mismatch."""

from __future__ import annotations

import json
import sys

import torch

from breeze_worker.engine.fastpath import fused, fused_rows


def _case(rows: int, dtype: torch.dtype, weight_dtype: torch.dtype, override: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    hidden, inter = 64, 96
    x = torch.randn(rows, 1, hidden, generator=g).to(dtype)
    w_post = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    gate_up = (0.2 * torch.randn(2 * inter, hidden, generator=g)).to(weight_dtype)
    down = (0.2 * torch.randn(hidden, inter, generator=g)).to(weight_dtype)
    fused._config_override = override
    results = {}
    for mode in ("torch", "kernel"):
        fused_rows._kernels_ok = mode == "kernel"
        fused._use_kernels = mode == "kernel"
        workspace = fused.DownWorkspace()
        h = fused_rows.norm_gate_up_rows(x, w_post, 1e-5, gate_up, inter)
        y = fused_rows.down_residual_rows(h, down, x, workspace)
        again = torch.equal(y, fused_rows.down_residual_rows(h, down, x, workspace))  # counters back at zero
        results[mode] = (h, y, again)
    fused._use_kernels = None
    fused_rows._kernels_ok = True
    cfg = fused_rows.plan("down_residual_rows", inter, rows)
    fused._config_override = {}
    tol = 1e-5 if weight_dtype == dtype == torch.float32 else 2e-3
    report = {"rows": rows, "dtype": str(dtype), "weights": str(weight_dtype), "block_m": cfg["block_m"],
              "splits": cfg["splits"], "workspace_reused_identical": results["kernel"][2]}
    ok = results["kernel"][2]
    for name, a, b in zip(("hidden", "out"), results["torch"][:2], results["kernel"][:2]):
        err = ((a.float() - b.float()).abs().max() / a.float().abs().max().clamp(min=1e-6)).item()
        report[name] = err
        ok = ok and err <= tol and bool(torch.isfinite(b.float()).all())
    report["ok"] = ok
    return report


def main() -> int:
    if not fused_rows._kernels_ok:
        print("Triton is not importable", file=sys.stderr)
        return 2
    f32, f16 = torch.float32, torch.float16
    small = {"norm_gate_up_rows": {"block_n": 32, "block_k": 16}, "down_residual_rows": {"block_n": 16,
                                                                                         "block_k": 32, "splits": 3}}
    tiles = {"norm_gate_up_rows": {"block_n": 64, "block_k": 32, "block_m": 16},  # 96 columns: one block masked
             "down_residual_rows": {"block_n": 32, "block_k": 32, "splits": 1, "block_m": 16}}
    cases = [(3, f32, f32, small), (20, f32, f32, tiles), (6, f32, f16, small), (33, f16, f16, tiles),
             (2, f32, f32, {"down_residual_rows": {"splits": 2, "block_k": 16}})]
    failed = 0
    for i, (rows, dtype, weight_dtype, override) in enumerate(cases):
        report = _case(rows, dtype, weight_dtype, override, seed=i)
        print(json.dumps(report), flush=True)
        failed += not report["ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
