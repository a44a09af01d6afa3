"""The MLP as two tensor-core Triton kernels for batched steps (3-64 model rows): the "gemm+mlp" form.

Why: above 2 rows the layers run as compiled units around library GEMMs ("gemm"). At 32 streams (48 rows)
a depth-decoder layer's MLP is five kernels there: the post-norm, the gate/up GEMM (11.7 us for 33.5 MB,
~68% of the H200's copy bandwidth), SiLU(gate) * up, the down GEMM (8.2 us for 16.8 MB) and the residual
add (results/batching/NOTES.md run 9), and the frame has 180 such steps. Here the MLP is two kernels (opt-in:
measured 1.4-1.7x slower than those five at 16-48 rows on the H200, results/batching/NOTES.md run 12):

- `norm_gate_up_rows`: RMSNorm in the prologue (each row's statistics in a first pass over its input, then
  the normalized input rounded to the weight's dtype chunk by chunk, as `fused_kernels._normed_row` does), the gate
  and up products with `tl.dot` (FP32 accumulation; IEEE FP32 when the weights are FP32, never TF32), and
  SiLU(gate) * up in the epilogue, each product rounded to the residual stream's dtype first.
- `down_residual_rows`: the down product with K split in SPLITS chunks and the residual add; the partial
  sums go to a workspace and the last program of a tile to arrive (an atomic counter) adds them in split
  order, so the result does not depend on arrival order (as `fused.down_residual`).

Both launch chained to the kernel before (programmatic dependent launch, `fused.pdl`). Launch settings are
fixed per shape by `plan` (not timed at start-up): the rounding must not change between processes.
`BREEZE_FUSED_CONFIG` overrides them for measurements (scripts/gpu_rows_mlp.py), by kernel name
("norm_gate_up_rows", "down_residual_rows") or name@width.

Without Triton, or off CUDA, the same stages run in torch (`fused`'s formulas); `TRITON_INTERPRET=1` runs the
kernels on CPU tensors (tests/fastpath/fused_interpreter_check.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from breeze_worker.engine.fastpath import fused

MAX_ROWS = 64  # one BLOCK_M tile of rows at most

_kernels_ok = False
if fused._triton is not None:
    try:
        import triton
        import triton.language as tl

        from breeze_worker.engine.fastpath.fused_kernels import (_add_residual, _add_splits, _last_arrival,
                                                                 _weights, gdc_launch_dependents, gdc_wait)

        @triton.jit
        def _dot(a, b, acc, IEEE: tl.constexpr):
            if IEEE:
                return tl.dot(a, b, acc, input_precision="ieee")
            return tl.dot(a, b, acc)

        @triton.jit
        def _norm_gate_up_rows_kernel(x_ptr, w_norm_ptr, w_ptr, out_ptr, M, H, I, eps, BLOCK_M: tl.constexpr,
                                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                                      EVICT: tl.constexpr, IEEE: tl.constexpr, GATED: tl.constexpr,
                                      USE_PDL: tl.constexpr):
            """out[M, I] = SiLU(gate) * up of norm(x) (GATED; the packed weight [2I, H]), else norm(x) @ w[I, H]^T."""
            if USE_PDL:
                gdc_launch_dependents()
            pid_n = tl.program_id(0)
            pid_m = tl.program_id(1)
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok = rows < M
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = cols < I
            kk = tl.arange(0, BLOCK_K)
            w_ty = w_ptr.dtype.element_ty
            out_ty = out_ptr.dtype.element_ty
            if USE_PDL:  # x is the kernel before's output
                gdc_wait()
            squares = tl.zeros([BLOCK_M], dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                ks = k0 + kk
                xv = tl.load(x_ptr + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & (ks < H)[None, :],
                             other=0.0).to(tl.float32)
                squares += tl.sum(xv * xv, axis=1)
            rstd = 1.0 / tl.sqrt(squares / H + eps)
            acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in tl.range(0, H, BLOCK_K, num_stages=STAGES):
                ks = k0 + kk
                k_ok = ks < H
                xv = tl.load(x_ptr + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                             other=0.0).to(tl.float32)
                wn = tl.load(w_norm_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
                xn = (xv * rstd[:, None] * wn[None, :]).to(w_ty)
                w_ok = col_ok[:, None] & k_ok[None, :]
                wg = _weights(w_ptr + cols[:, None] * H + ks[None, :], w_ok, EVICT)
                acc_g = _dot(xn, tl.trans(wg), acc_g, IEEE)
                if GATED:
                    wu = _weights(w_ptr + (cols + I)[:, None] * H + ks[None, :], w_ok, EVICT)
                    acc_u = _dot(xn, tl.trans(wu), acc_u, IEEE)
            gate = acc_g.to(out_ty).to(tl.float32)
            out_ok = row_ok[:, None] & col_ok[None, :]
            dst = out_ptr + rows[:, None] * I + cols[None, :]
            if GATED:
                up = acc_u.to(out_ty).to(tl.float32)
                tl.store(dst, (gate / (1.0 + tl.exp(-gate)) * up).to(out_ty), mask=out_ok)
            else:
                tl.store(dst, gate.to(out_ty), mask=out_ok)

        @triton.jit
        def _down_residual_rows_kernel(h_ptr, w_ptr, x_ptr, y_ptr, ws_ptr, count_ptr, M, N, K,
                                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                       SPLITS: tl.constexpr, STAGES: tl.constexpr, EVICT: tl.constexpr,
                                       IEEE: tl.constexpr, USE_PDL: tl.constexpr):
            """y[M, N] = x + h[M, K] @ w[N, K]^T; K in SPLITS chunks (K a multiple of SPLITS * BLOCK_K)."""
            if USE_PDL:
                gdc_launch_dependents()
            pid_n = tl.program_id(0)
            split = tl.program_id(1)
            pid_m = tl.program_id(2)
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok = rows < M
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = cols < N
            kk = tl.arange(0, BLOCK_K)
            w_ty = w_ptr.dtype.element_ty
            chunk = K // SPLITS
            if USE_PDL:  # h is the kernel before's output; partials, counters and y are touched after it
                gdc_wait()
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in tl.range(split * chunk, split * chunk + chunk, BLOCK_K, num_stages=STAGES):
                ks = k0 + kk
                hv = tl.load(h_ptr + rows[:, None] * K + ks[None, :], mask=row_ok[:, None], other=0.0).to(w_ty)
                w = _weights(w_ptr + cols[:, None] * K + ks[None, :], col_ok[:, None], EVICT)
                acc = _dot(hv, tl.trans(w), acc, IEEE)
            out_ok = row_ok[:, None] & col_ok[None, :]
            at = rows[:, None] * N + cols[None, :]
            if SPLITS == 1:
                _add_residual(x_ptr, y_ptr, at, out_ok, acc)
            else:
                tl.store(ws_ptr + split * M * N + at, acc, mask=out_ok)
                tile = pid_m * tl.num_programs(0) + pid_n
                if _last_arrival(count_ptr + tile) == SPLITS - 1:
                    _add_splits(ws_ptr, x_ptr, y_ptr, at, out_ok, M * N, SPLITS)
                    tl.atomic_xchg(count_ptr + tile, 0)

        _kernels_ok = True
    except Exception:  # an unusable Triton: the torch formulas serve
        _kernels_ok = False


def available(device: torch.device) -> bool:
    return _kernels_ok and fused.available(device)


def _block_m(rows: int) -> int:
    """Rows per tile: the next power of two from 16 (tl.dot's smallest) up to MAX_ROWS."""
    block = 16
    while block < rows:
        block *= 2
    return block


def plan(kernel: str, k: int, rows: int) -> dict:
    """Fixed launch settings (module docstring) of `kernel` at input width `k` and `rows` model rows;
    `BREEZE_FUSED_CONFIG` may override them by kernel or kernel@width (fused.plan's rules). NOT yet timed on
    a GPU: the defaults are a starting point for scripts/gpu_rows_mlp.py."""
    if kernel == "norm_gate_up_rows":
        cfg = {"block_n": 64, "block_k": 128, "stages": 3, "num_warps": 4, "evict": True}
    elif kernel == "down_residual_rows":
        cfg = {"block_n": 64, "block_k": 128, "splits": 8, "stages": 3, "num_warps": 4, "evict": True}
    else:
        raise ValueError(f"unknown rows kernel {kernel!r}")
    cfg["block_m"] = _block_m(rows)
    fused.apply_overrides(cfg, kernel, k)
    cfg["block_k"] = min(cfg["block_k"], max(16, k & -k))
    if kernel == "down_residual_rows":
        while cfg["splits"] > 1 and k % (cfg["splits"] * cfg["block_k"]):
            cfg["splits"] //= 2
        if k % (cfg["splits"] * cfg["block_k"]):
            raise ValueError(f"down_residual_rows: K {k} is not a multiple of block_k {cfg['block_k']}")
    return cfg


def supported(layer, rows: int) -> bool:
    """Whether `mlp` applies: a PackedLayer with packed gate/up, SiLU, no biases; at most MAX_ROWS rows; input
    widths multiples of 16 (tl.dot)."""
    return (rows <= MAX_ROWS and layer.decodable and layer.act is F.silu and layer.gate_up.shape[1] % 16 == 0
            and layer.intermediate % 16 == 0)


def norm_gate_up_rows(x: torch.Tensor, w_norm: torch.Tensor, eps: float, gate_up: torch.Tensor,
                      intermediate: int) -> torch.Tensor:
    """SiLU(gate(norm(x))) * up(norm(x)) for x [R, T, H] -> [R, T, I] (fused.norm_gate_up's function)."""
    rows, t, hidden = x.shape
    m = rows * t
    if not available(x.device):
        normed = fused._rms(x, w_norm, eps, gate_up.dtype)
        gate = fused._linear(normed, gate_up[:intermediate], x.dtype).float()
        up = fused._linear(normed, gate_up[intermediate:], x.dtype).float()
        return (F.silu(gate) * up).to(x.dtype)
    cfg = plan("norm_gate_up_rows", hidden, m)
    out = torch.empty(rows, t, intermediate, dtype=x.dtype, device=x.device)
    grid = (-(-intermediate // cfg["block_n"]), -(-m // cfg["block_m"]))
    _norm_gate_up_rows_kernel[grid](x.contiguous(), w_norm, gate_up, out, m, hidden, intermediate, eps,
                                    BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"],
                                    STAGES=cfg["stages"], EVICT=cfg["evict"], IEEE=gate_up.dtype == torch.float32,
                                    GATED=True, num_warps=cfg["num_warps"], **fused._launch(x.device))
    return out


def down_residual_rows(hidden: torch.Tensor, down: torch.Tensor, x: torch.Tensor,
                       workspace: fused.DownWorkspace) -> torch.Tensor:
    """x + down(hidden), hidden [R, T, I], x [R, T, H] (fused.down_residual's function)."""
    rows, t, k = hidden.shape
    n = down.shape[0]
    m = rows * t
    if not available(x.device):
        return (x.float() + fused._linear(hidden, down, x.dtype).float()).to(x.dtype)
    cfg = plan("down_residual_rows", k, m)
    n_blocks, m_blocks = -(-n // cfg["block_n"]), -(-m // cfg["block_m"])
    partials, counts = workspace.get(x.device, cfg["splits"], m, n, n_blocks * m_blocks, kind="rows")
    y = torch.empty_like(x)
    _down_residual_rows_kernel[(n_blocks, cfg["splits"], m_blocks)](
        hidden.contiguous(), down, x.contiguous(), y, partials, counts, m, n, k, BLOCK_M=cfg["block_m"],
        BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], SPLITS=cfg["splits"], STAGES=cfg["stages"],
        EVICT=cfg["evict"], IEEE=down.dtype == torch.float32, num_warps=cfg["num_warps"], **fused._launch(x.device))
    return y


def mlp(layer, x: torch.Tensor, workspace: fused.DownWorkspace) -> torch.Tensor:
    """x + down(SiLU(gate(norm(x))) * up(norm(x))) of a PackedLayer, as two kernels."""
    hidden = norm_gate_up_rows(x, layer.w_post, layer.eps_post, layer.gate_up, layer.intermediate)
    return down_residual_rows(hidden, layer.mlp.down_proj.weight, x, workspace)
