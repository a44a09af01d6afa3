"""A GEMV-shaped product for 1-8 rows as one Triton kernel: y = x @ W^T, FP32 accumulation.

Why not the GEMM library or Inductor's reduction: at 2 rows every projection of a decode step reads a
weight matrix once and does 2 FLOPs per element, so its floor is the weight's bytes over bandwidth. The
library's GEMM kernels at this shape add split-K helpers and reach ~40-60% of bandwidth; Inductor's
generated reduction re-reads the input vector for every small block of outputs (measured 2x the byte floor
for the depth decoder's down projection on the H200). Here each program owns BLOCK_N output columns,
streams its weight rows once in BLOCK_K chunks and reuses each input chunk for all BLOCK_N columns and
all rows. Projections with few output columns also split K (`splits` partial sums, added by the caller's
next fused kernel), so there are enough programs to keep the memory system busy.

`gemv(x, w)` returns the FP32 partial sums [splits, R, N]; `small_linear` sums them and casts. Without
CUDA or Triton (the CPU tests), the same function in torch: FP32 products of the input rounded to the
weight's dtype, summed over K.
"""

from __future__ import annotations

import importlib.util

import torch

BLOCK_N = 16
TARGET_PROGRAMS = 264  # about two per SM on an H100/H200; fewer leaves bandwidth unused
MAX_ROWS = 8

_triton = None
if importlib.util.find_spec("triton") is not None:
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def _gemv_kernel(x_ptr, w_ptr, y_ptr, R, N, K, k_per_split, stride_w,
                         R_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
            pid_n = tl.program_id(0)
            split = tl.program_id(1)
            rows = tl.arange(0, R_PAD)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            row_ok = rows < R
            col_ok = cols < N
            # element-wise products accumulate in registers; the one reduction over K comes after the loop
            # (a reduction per chunk costs a cross-warp exchange per iteration: the first version did that
            # and ran at ~2x the library's time on the H200, results/gpu_run6/gemv_check.json)
            acc = tl.zeros([R_PAD, BLOCK_N, BLOCK_K], dtype=tl.float32)
            k_start = split * k_per_split
            for k0 in range(0, k_per_split, BLOCK_K):
                ks = k_start + k0 + tl.arange(0, BLOCK_K)
                k_ok = (ks < K) & (k0 + tl.arange(0, BLOCK_K) < k_per_split)
                x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_ptr + cols[:, None] * stride_w + ks[None, :], mask=col_ok[:, None] & k_ok[None, :],
                            other=0.0)
                acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
            out = y_ptr + split * R * N + rows[:, None] * N + cols[None, :]
            tl.store(out, tl.sum(acc, axis=2), mask=row_ok[:, None] & col_ok[None, :])

        _triton = triton
    except Exception:  # an unusable Triton: the torch formula serves
        _triton = None


def available(device: torch.device) -> bool:
    return _triton is not None and device.type == "cuda"


def plan(rows: int, n: int, k: int) -> tuple[int, int, int]:
    """(splits, block_k, row_pad) for a product of `rows` x `k` by `n` x `k`."""
    row_pad = 1
    while row_pad < rows:
        row_pad *= 2
    block_k = max(32, 512 // row_pad)  # R_PAD x BLOCK_N x BLOCK_K FP32 accumulators in registers (64 per thread)
    programs = -(-n // BLOCK_N)
    splits = 1
    while programs * splits < TARGET_PROGRAMS and k // (splits * 2) >= 2 * block_k and splits < 8:
        splits *= 2
    return splits, block_k, row_pad


def gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [R, K] (R <= MAX_ROWS), weight [N, K] (unit stride along K) -> FP32 partial sums [splits, R, N]."""
    rows, k = x.shape
    n = weight.shape[0]
    x = x.to(weight.dtype).contiguous()
    if not available(x.device):
        return (x.float()[:, None, :] * weight.float()[None]).sum(-1)[None]
    splits, block_k, row_pad = plan(rows, n, k)
    k_per_split = -(-k // splits)
    out = torch.empty(splits, rows, n, dtype=torch.float32, device=x.device)
    grid = (-(-n // BLOCK_N), splits)
    _gemv_kernel[grid](x, weight, out, rows, n, k, k_per_split, weight.stride(0), R_PAD=row_pad, BLOCK_N=BLOCK_N,
                       BLOCK_K=block_k, num_warps=4)
    return out


def small_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] with at most MAX_ROWS rows in all -> x @ weight^T in x's dtype (FP32 accumulation)."""
    lead, k = x.shape[:-1], x.shape[-1]
    y = gemv(x.reshape(-1, k), weight).sum(0)
    return y.reshape(*lead, weight.shape[0]).to(x.dtype)
