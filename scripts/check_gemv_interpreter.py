"""Check the Triton GEMV kernel (engine/fastpath/gemv.py) on the CPU in Triton's interpreter, before any
GPU time is spent: odd sizes (masks), 1-8 rows (row padding), K split into partial sums, FP32 and BF16,
against an FP64 reference. Needs `pip install triton` (not a test dependency: CI has no Triton).

    TRITON_INTERPRET=1 PYTHONPATH=worker python3 scripts/check_gemv_interpreter.py
"""

from __future__ import annotations

import os
import sys

import torch


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("set TRITON_INTERPRET=1 (the kernel must be built by the interpreter)", file=sys.stderr)
        return 2
    from breeze_worker.engine.fastpath import gemv

    if gemv._triton is None:
        print("Triton is not importable here", file=sys.stderr)
        return 2
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for rows, n, k, dtype in [(2, 100, 300, torch.float32), (1, 64, 512, torch.float32), (3, 33, 1100, torch.float32),
                              (8, 40, 2048, torch.float32), (2, 50, 1024, torch.bfloat16), (5, 17, 4000, torch.bfloat16)]:
        x = torch.randn(rows, k, generator=generator)
        w = torch.randn(n, k, generator=generator).to(dtype)
        splits, block_k, row_pad = gemv.plan(rows, n, k)
        out = torch.full((splits, rows, n), float("nan"))  # every element must be written
        grid = (-(-n // gemv.BLOCK_N), splits)
        gemv._gemv_kernel[grid](x.to(dtype).contiguous(), w, out, rows, n, k, -(-k // splits), w.stride(0),
                                R_PAD=row_pad, BLOCK_N=gemv.BLOCK_N, BLOCK_K=block_k)
        ref = x.to(dtype).double() @ w.double().T
        err = ((out.sum(0).double() - ref).norm() / ref.norm()).item()
        unwritten = bool(torch.isnan(out).any())
        worst = max(worst, err if not unwritten else float("inf"))
        print(f"rows {rows} n {n} k {k} {dtype} splits {splits}: rel. error {err:.2e}, unwritten: {unwritten}")
    ok = worst < 1e-6
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
