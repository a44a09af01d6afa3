"""The depth decoder's layer as four Triton kernels for 1-8 rows (the "fused" form, fastpath/layers.py).

Why: at batch 1 with CFG (2 rows) a depth-decoder layer step reads ~56 MB of weights (13 us at the H200's
copy bandwidth) but ran as 14 kernels taking ~38 us (units+attn, results/NOTES.md run 7): besides the
four projections, ten small kernels of 1-2.5 us each (norm statistics, RoPE, two cache copies, three
attention kernels, residual adds, the activation). The frame has 180 such steps (12 layers x 15
positions), so those small kernels alone are ~3 ms of the 11 ms frame. Here every element-wise stage
rides on a projection:

1. `qkv_rope`: RMSNorm (each program recomputes the row statistics from the 1024-wide input, cheaper than
   a kernel of its own), q/k/v projection, RoPE on q and k, k and v written straight into their cache
   slot, q into a buffer. A program owns BLOCK_P column pairs (d, d + D/2) of one head, so RoPE is local.
2. `attention_out`: attention over the layer's 16 depth slots (each program recomputes it for all heads:
   ~128 K multiply-adds against a 32 KB weight slice) and the output projection plus residual.
3. `norm_gate_up`: RMSNorm, gate and up projections over the same columns, SiLU(gate) * up.
4. `down_residual`: the down projection plus residual, K split over SPLITS programs per column block. The
   partial sums go to a workspace; the last program of a block to finish (an atomic counter) adds them
   in split order, so the result does not depend on arrival order, and resets the counter.

Numerics follow the units form (fastpath/layers.py) stage by stage: FP32 accumulation, each projection's
input rounded to the weight's dtype, its output to the residual stream's dtype, softmax in FP32, the
attention probabilities and output rounded to the values' dtype. Block sizes are fixed per shape by
`plan_*` (not timed at start-up): the summation order, hence the rounding, must not change between
processes, or a seed would not give the same audio after a restart. `BREEZE_FUSED_CONFIG` overrides them
for measurements (scripts/gpu_fused.py).

Without Triton, or off CUDA (CI), each function runs the same computation in torch; `TRITON_INTERPRET=1`
runs the kernels themselves on CPU tensors (tests/engine/test_fused.py, in a subprocess).
"""

from __future__ import annotations

import importlib.util
import json
import os

import torch
import torch.nn.functional as F

CONFIG_ENV = "BREEZE_FUSED_CONFIG"
MAX_ROWS = 8
_ACC_BUDGET = 8192  # FP32 accumulator elements per program (64 registers a thread at 4 warps)

_triton = None
if importlib.util.find_spec("triton") is not None:
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def _row_rstd(x_ptr, rows, row_ok, H, eps, M_PAD: tl.constexpr, BLOCK_K: tl.constexpr):
            ss = tl.zeros([M_PAD], dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                xv = tl.load(x_ptr + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & (ks < H)[None, :],
                             other=0.0).to(tl.float32)
                ss += tl.sum(xv * xv, axis=1)
            return 1.0 / tl.sqrt(ss / H + eps)

        @triton.jit
        def _qkv_rope_kernel(x_ptr, w_norm_ptr, w_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, M, T, H, start, eps,
                             stride_cr, stride_ck, stride_cl, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                             HEAD_DIM: tl.constexpr, M_PAD: tl.constexpr, BLOCK_P: tl.constexpr,
                             BLOCK_K: tl.constexpr):
            HALF: tl.constexpr = HEAD_DIM // 2
            PER_HEAD: tl.constexpr = HALF // BLOCK_P
            pid = tl.program_id(0)
            head = pid // PER_HEAD
            pairs = (pid % PER_HEAD) * BLOCK_P + tl.arange(0, BLOCK_P)
            rows = tl.arange(0, M_PAD)
            row_ok = rows < M
            rstd = _row_rstd(x_ptr, rows, row_ok, H, eps, M_PAD, BLOCK_K)
            col1 = head * HEAD_DIM + pairs
            acc1 = tl.zeros([M_PAD, BLOCK_P, BLOCK_K], dtype=tl.float32)
            acc2 = tl.zeros([M_PAD, BLOCK_P, BLOCK_K], dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                k_ok = ks < H
                xv = tl.load(x_ptr + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                             other=0.0).to(tl.float32)
                wn = tl.load(w_norm_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
                xn = (xv * rstd[:, None] * wn[None, :]).to(w_ptr.dtype.element_ty).to(tl.float32)
                w1 = tl.load(w_ptr + col1[:, None] * H + ks[None, :], mask=k_ok[None, :], other=0.0).to(tl.float32)
                w2 = tl.load(w_ptr + (col1 + HALF)[:, None] * H + ks[None, :], mask=k_ok[None, :],
                             other=0.0).to(tl.float32)
                acc1 += xn[:, None, :] * w1[None, :, :]
                acc2 += xn[:, None, :] * w2[None, :, :]
            out_ty = q_ptr.dtype.element_ty
            a1 = tl.sum(acc1, axis=2).to(out_ty).to(tl.float32)  # [M_PAD, BLOCK_P]
            a2 = tl.sum(acc2, axis=2).to(out_ty).to(tl.float32)
            r = rows // T
            t = rows % T
            store_ok = row_ok[:, None]
            if head < HEADS + KV_HEADS:  # q and k heads: RoPE, out = x * cos + rotate_half(x) * sin
                table = t[:, None] * HEAD_DIM + pairs[None, :]
                cos1 = tl.load(cos_ptr + table, mask=store_ok, other=0.0).to(tl.float32)
                cos2 = tl.load(cos_ptr + table + HALF, mask=store_ok, other=0.0).to(tl.float32)
                sin1 = tl.load(sin_ptr + table, mask=store_ok, other=0.0).to(tl.float32)
                sin2 = tl.load(sin_ptr + table + HALF, mask=store_ok, other=0.0).to(tl.float32)
                o1 = a1 * cos1 - a2 * sin1
                o2 = a2 * cos2 + a1 * sin2
                if head < HEADS:
                    dst = q_ptr + rows[:, None] * (HEADS * HEAD_DIM) + head * HEAD_DIM + pairs[None, :]
                else:
                    dst = (k_ptr + r[:, None] * stride_cr + (head - HEADS) * stride_ck
                           + (start + t)[:, None] * stride_cl + pairs[None, :])
                tl.store(dst, o1.to(out_ty), mask=store_ok)
                tl.store(dst + HALF, o2.to(out_ty), mask=store_ok)
            else:
                dst = (v_ptr + r[:, None] * stride_cr + (head - HEADS - KV_HEADS) * stride_ck
                       + (start + t)[:, None] * stride_cl + pairs[None, :])
                tl.store(dst, a1.to(out_ty), mask=store_ok)
                tl.store(dst + HALF, a2.to(out_ty), mask=store_ok)

        @triton.jit
        def _attention_out_kernel(q_ptr, k_ptr, v_ptr, x_ptr, w_ptr, y_ptr, M, T, start, scale, N,
                                  stride_cr, stride_ck, stride_cl, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                                  HEAD_DIM: tl.constexpr, SLOTS: tl.constexpr, M_PAD: tl.constexpr,
                                  BLOCK_N: tl.constexpr):
            GROUP: tl.constexpr = HEADS // KV_HEADS
            WIDTH: tl.constexpr = HEADS * HEAD_DIM
            pid = tl.program_id(0)
            cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = cols < N
            rows = tl.arange(0, M_PAD)
            row_ok = rows < M
            r = rows // T
            t = rows % T
            d = tl.arange(0, HEAD_DIM)
            slots = tl.arange(0, SLOTS)
            allowed = slots[None, :] <= (start + t)[:, None]  # [M_PAD, SLOTS]: this frame's slots so far
            load_ok = (allowed & row_ok[:, None])[:, :, None]
            val_ty = v_ptr.dtype.element_ty
            w_ty = w_ptr.dtype.element_ty
            acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
            for g in tl.static_range(KV_HEADS):
                kv = r[:, None, None] * stride_cr + g * stride_ck + slots[None, :, None] * stride_cl + d[None, None, :]
                keys = tl.load(k_ptr + kv, mask=load_ok, other=0.0).to(tl.float32)  # [M_PAD, SLOTS, D]
                vals = tl.load(v_ptr + kv, mask=load_ok, other=0.0).to(tl.float32)
                for j in tl.static_range(GROUP):
                    hd = g * GROUP + j
                    q = tl.load(q_ptr + rows[:, None] * WIDTH + hd * HEAD_DIM + d[None, :], mask=row_ok[:, None],
                                other=0.0).to(tl.float32)
                    s = tl.sum(q[:, None, :] * keys, axis=2) * scale
                    s = tl.where(allowed, s, float("-inf"))
                    e = tl.exp(s - tl.max(s, axis=1)[:, None])
                    p = (e / tl.sum(e, axis=1)[:, None]).to(val_ty).to(tl.float32)
                    out = tl.sum(p[:, :, None] * vals, axis=1).to(val_ty).to(w_ty).to(tl.float32)  # [M_PAD, D]
                    w = tl.load(w_ptr + cols[:, None] * WIDTH + hd * HEAD_DIM + d[None, :], mask=col_ok[:, None],
                                other=0.0).to(tl.float32)
                    acc += tl.sum(out[:, None, :] * w[None, :, :], axis=2)
            out_ty = y_ptr.dtype.element_ty
            ok = row_ok[:, None] & col_ok[None, :]
            xv = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=ok, other=0.0).to(tl.float32)
            y = xv + acc.to(out_ty).to(tl.float32)
            tl.store(y_ptr + rows[:, None] * N + cols[None, :], y.to(out_ty), mask=ok)

        @triton.jit
        def _norm_gate_up_kernel(x_ptr, w_norm_ptr, w_ptr, out_ptr, M, H, I, eps, M_PAD: tl.constexpr,
                                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
            pid = tl.program_id(0)
            cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = cols < I
            rows = tl.arange(0, M_PAD)
            row_ok = rows < M
            rstd = _row_rstd(x_ptr, rows, row_ok, H, eps, M_PAD, BLOCK_K)
            acc_g = tl.zeros([M_PAD, BLOCK_N, BLOCK_K], dtype=tl.float32)
            acc_u = tl.zeros([M_PAD, BLOCK_N, BLOCK_K], dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                k_ok = ks < H
                xv = tl.load(x_ptr + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                             other=0.0).to(tl.float32)
                wn = tl.load(w_norm_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
                xn = (xv * rstd[:, None] * wn[None, :]).to(w_ptr.dtype.element_ty).to(tl.float32)
                w_ok = col_ok[:, None] & k_ok[None, :]
                wg = tl.load(w_ptr + cols[:, None] * H + ks[None, :], mask=w_ok, other=0.0).to(tl.float32)
                wu = tl.load(w_ptr + (cols + I)[:, None] * H + ks[None, :], mask=w_ok, other=0.0).to(tl.float32)
                acc_g += xn[:, None, :] * wg[None, :, :]
                acc_u += xn[:, None, :] * wu[None, :, :]
            out_ty = out_ptr.dtype.element_ty
            gate = tl.sum(acc_g, axis=2).to(out_ty).to(tl.float32)
            up = tl.sum(acc_u, axis=2).to(out_ty).to(tl.float32)
            hidden = gate / (1.0 + tl.exp(-gate)) * up  # SiLU(gate) * up
            tl.store(out_ptr + rows[:, None] * I + cols[None, :], hidden.to(out_ty),
                     mask=row_ok[:, None] & col_ok[None, :])

        @triton.jit
        def _down_residual_kernel(h_ptr, w_ptr, x_ptr, y_ptr, ws_ptr, count_ptr, M, N, K, k_per_split,
                                  M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                  SPLITS: tl.constexpr):
            pid = tl.program_id(0)
            split = tl.program_id(1)
            cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = cols < N
            rows = tl.arange(0, M_PAD)
            row_ok = rows < M
            w_ty = w_ptr.dtype.element_ty
            acc = tl.zeros([M_PAD, BLOCK_N, BLOCK_K], dtype=tl.float32)
            k_start = split * k_per_split
            for k0 in range(0, k_per_split, BLOCK_K):
                ks = k_start + k0 + tl.arange(0, BLOCK_K)
                k_ok = (ks < K) & (k0 + tl.arange(0, BLOCK_K) < k_per_split)
                hv = tl.load(h_ptr + rows[:, None] * K + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                             other=0.0).to(w_ty).to(tl.float32)
                w = tl.load(w_ptr + cols[:, None] * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :],
                            other=0.0).to(tl.float32)
                acc += hv[:, None, :] * w[None, :, :]
            part = tl.sum(acc, axis=2)  # [M_PAD, BLOCK_N]
            out_ty = y_ptr.dtype.element_ty
            ok = row_ok[:, None] & col_ok[None, :]
            tile = rows[:, None] * N + cols[None, :]
            if SPLITS == 1:
                xv = tl.load(x_ptr + tile, mask=ok, other=0.0).to(tl.float32)
                tl.store(y_ptr + tile, (xv + part.to(out_ty).to(tl.float32)).to(out_ty), mask=ok)
            else:
                tl.store(ws_ptr + split * (M_PAD * N) + tile, part, mask=ok)
                # release our partial, and learn whether every other split of this block has released its own
                arrived = tl.atomic_add(count_ptr + pid, 1, sem="acq_rel")
                if arrived == SPLITS - 1:
                    total = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
                    for s in range(SPLITS):  # split order, whatever the arrival order
                        total += tl.load(ws_ptr + s * (M_PAD * N) + tile, mask=ok, other=0.0, cache_modifier=".cg")
                    xv = tl.load(x_ptr + tile, mask=ok, other=0.0).to(tl.float32)
                    tl.store(y_ptr + tile, (xv + total.to(out_ty).to(tl.float32)).to(out_ty), mask=ok)
                    tl.atomic_xchg(count_ptr + pid, 0)

        _triton = triton
    except Exception:  # an unusable Triton: the torch formulas serve
        _triton = None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


_use_kernels: bool | None = None  # the interpreter check: False = the torch stages, True = the kernels
_config_override: dict = {}  # the interpreter check: launch settings per kernel, as BREEZE_FUSED_CONFIG


def available(device: torch.device) -> bool:
    """Whether the kernels run for tensors on `device` (CUDA with Triton; the CPU under the interpreter)."""
    if _triton is None or _use_kernels is False:
        return False
    return device.type == "cuda" or (interpreting() and device.type == "cpu")


def _pad(rows: int) -> int:
    pad = 1
    while pad < rows:
        pad *= 2
    return pad


def _overrides() -> dict:
    text = os.environ.get(CONFIG_ENV, "").strip()
    if not text:
        return {}
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"{CONFIG_ENV} must be a JSON object of kernel name -> settings")
    return value


def _block_k(m_pad: int, block_n: int, accumulators: int, limit: int) -> int:
    block_k = 32
    while block_k * 2 * m_pad * block_n * accumulators <= _ACC_BUDGET and block_k * 2 <= limit:
        block_k *= 2
    return block_k


def plan(kernel: str, rows: int, n: int, k: int) -> dict:
    """Fixed launch settings of `kernel` for `rows` x `k` inputs and `n` outputs (module docstring: fixed,
    not timed, so the rounding never changes between processes); `BREEZE_FUSED_CONFIG` may override."""
    m_pad = _pad(rows)
    if kernel == "qkv_rope":  # `n` here: the head dimension (a program owns column pairs of one head)
        cfg = {"block_p": min(8, max(1, n // 2)), "num_warps": 4}
    elif kernel == "attention_out":
        cfg = {"block_n": 8, "num_warps": 4 if m_pad <= 2 else 8}
    elif kernel == "norm_gate_up":
        cfg = {"block_n": 16, "num_warps": 4}
    elif kernel == "down_residual":
        cfg = {"block_n": 16, "splits": 4, "num_warps": 4}
    else:
        raise ValueError(f"unknown fused kernel {kernel!r}")
    cfg.update(_overrides().get(kernel, {}))
    cfg.update(_config_override.get(kernel, {}))
    accumulators = {"qkv_rope": 2, "norm_gate_up": 2, "down_residual": 1}.get(kernel)
    if accumulators is not None and "block_k" not in cfg:
        width = cfg.get("block_p", cfg.get("block_n"))
        limit = k if kernel != "down_residual" else max(32, k // cfg["splits"])
        cfg["block_k"] = _block_k(m_pad, width, accumulators, limit)
    return cfg


# ---- the four stages; each is also written in torch (the CPU path and the reference) ----

def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(dtype)


def _linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return F.linear(x.to(weight.dtype).float(), weight.float()).to(out_dtype)


def qkv_rope(x: torch.Tensor, w_norm: torch.Tensor, eps: float, qkv: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, *, heads: int,
             kv_heads: int, head_dim: int) -> torch.Tensor:
    """x [R, T, H] -> q [R * T, heads * D]; k and v [R, kv, T, D] written into the caches [R, kv, L, D] at
    slots start..start+T-1. cos/sin [T, D] (the tables of those positions)."""
    rows, t, hidden = x.shape
    m = rows * t
    dtype = x.dtype
    if not available(x.device):
        proj = _linear(_rms(x, w_norm, eps, qkv.dtype), qkv, dtype).view(rows, t, heads + 2 * kv_heads, head_dim)
        proj = proj.transpose(1, 2).float()  # [R, heads + 2kv, T, D]
        qk, v = proj[:, :heads + kv_heads], proj[:, heads + kv_heads:]
        half = head_dim // 2
        c, s = cos.float()[None, None], sin.float()[None, None]
        qk = qk * c + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * s
        k_cache[:, :, start:start + t] = qk[:, heads:].to(k_cache.dtype)
        v_cache[:, :, start:start + t] = v.to(v_cache.dtype)
        return qk[:, :heads].to(dtype).transpose(1, 2).reshape(m, heads * head_dim)
    _check_cache(k_cache, v_cache, head_dim)
    cfg = plan("qkv_rope", m, head_dim, hidden)
    q = torch.empty(m, heads * head_dim, dtype=dtype, device=x.device)
    grid = ((heads + 2 * kv_heads) * (head_dim // 2) // cfg["block_p"],)
    _qkv_rope_kernel[grid](x.contiguous(), w_norm, qkv, cos.contiguous(), sin.contiguous(), q, k_cache, v_cache, m, t,
                           hidden, start, eps, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), HEADS=heads,
                           KV_HEADS=kv_heads, HEAD_DIM=head_dim, M_PAD=_pad(m), BLOCK_P=cfg["block_p"],
                           BLOCK_K=cfg["block_k"], num_warps=cfg["num_warps"])
    return q


def attention_out(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, t: int, x: torch.Tensor,
                  o_proj: torch.Tensor, scale: float, *, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """q [R * T, heads * D] attends over cache slots 0..start+t' (t' its position in the step); returns
    x + o_proj(attention) with x [R, T, H]."""
    rows, _, hidden = x.shape
    m = rows * t
    slots = k_cache.shape[2]
    if not available(x.device):
        qh = q.view(rows, t, heads, head_dim).transpose(1, 2).float()  # [R, h, T, D]
        group = heads // kv_heads
        keys = k_cache.float().repeat_interleave(group, dim=1)
        vals = v_cache.float().repeat_interleave(group, dim=1)
        scores = torch.matmul(qh, keys.transpose(2, 3)) * scale  # [R, h, T, L]
        allowed = torch.arange(slots, device=x.device)[None, :] <= start + torch.arange(t, device=x.device)[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v_cache.dtype).float()
        vals[:, :, start + t:] = 0.0  # not written yet this frame (the kernel masks its loads the same way)
        out = torch.matmul(probs, vals).to(v_cache.dtype).transpose(1, 2).reshape(rows, t, heads * head_dim)
        return (x.float() + _linear(out, o_proj, x.dtype).float()).to(x.dtype)
    _check_cache(k_cache, v_cache, head_dim)
    cfg = plan("attention_out", m, hidden, heads * head_dim)
    y = torch.empty_like(x)
    grid = (-(-hidden // cfg["block_n"]),)
    _attention_out_kernel[grid](q, k_cache, v_cache, x.contiguous(), o_proj, y, m, t, start, scale, hidden,
                                k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), HEADS=heads,
                                KV_HEADS=kv_heads, HEAD_DIM=head_dim, SLOTS=slots, M_PAD=_pad(m),
                                BLOCK_N=cfg["block_n"], num_warps=cfg["num_warps"])
    return y


def norm_gate_up(x: torch.Tensor, w_norm: torch.Tensor, eps: float, gate_up: torch.Tensor,
                 intermediate: int) -> torch.Tensor:
    """SiLU(gate(norm(x))) * up(norm(x)) for x [R, T, H] -> [R, T, I]."""
    rows, t, hidden = x.shape
    m = rows * t
    if not available(x.device):
        normed = _rms(x, w_norm, eps, gate_up.dtype)
        gate = _linear(normed, gate_up[:intermediate], x.dtype).float()
        up = _linear(normed, gate_up[intermediate:], x.dtype).float()
        return (F.silu(gate) * up).to(x.dtype)
    cfg = plan("norm_gate_up", m, intermediate, hidden)
    out = torch.empty(rows, t, intermediate, dtype=x.dtype, device=x.device)
    grid = (-(-intermediate // cfg["block_n"]),)
    _norm_gate_up_kernel[grid](x.contiguous(), w_norm, gate_up, out, m, hidden, intermediate, eps, M_PAD=_pad(m),
                               BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], num_warps=cfg["num_warps"])
    return out


class DownWorkspace:
    """Partial sums and arrival counters of `down_residual`, one set per (device, shape): allocated by the
    warm-up call before graph capture. One FrameStep owns one and its layers share it (they run one after
    another on one stream); steps that may run concurrently must not share one."""

    def __init__(self):
        self._buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, device: torch.device, splits: int, m_pad: int, n: int, blocks: int):
        key = (str(device), splits, m_pad, n, blocks)
        if key not in self._buffers:
            self._buffers[key] = (torch.empty(splits, m_pad, n, dtype=torch.float32, device=device),
                                  torch.zeros(blocks, dtype=torch.int32, device=device))
        return self._buffers[key]


def down_residual(hidden: torch.Tensor, down: torch.Tensor, x: torch.Tensor, workspace: DownWorkspace) -> torch.Tensor:
    """x + down(hidden), hidden [R, T, I], x [R, T, H]."""
    rows, t, k = hidden.shape
    n = down.shape[0]
    m = rows * t
    if not available(x.device):
        return (x.float() + _linear(hidden, down, x.dtype).float()).to(x.dtype)
    cfg = plan("down_residual", m, n, k)
    splits = cfg["splits"]
    blocks = -(-n // cfg["block_n"])
    partials, counts = workspace.get(x.device, splits, _pad(m), n, blocks)
    k_per_split = -(-k // splits)
    y = torch.empty_like(x)
    _down_residual_kernel[(blocks, splits)](hidden.contiguous(), down, x.contiguous(), y, partials, counts, m, n, k,
                                            k_per_split, M_PAD=_pad(m), BLOCK_N=cfg["block_n"],
                                            BLOCK_K=cfg["block_k"], SPLITS=splits, num_warps=cfg["num_warps"])
    return y


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, head_dim: int) -> None:
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1 or k_cache.shape[3] != head_dim:
        raise ValueError("the fused kernels need key/value caches [R, kv, L, D] of one layout, unit stride along D")


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def supported(layer, rows: int, slots: int) -> bool:
    """Whether `layer` (a PackedLayer) can run fused at `rows` rows (rows times positions) over `slots`
    cache slots: a Llama-style layer (no q/k norm, SiLU, no biases) whose head size and slot count are
    powers of two (Triton block shapes)."""
    if not (rows <= MAX_ROWS and layer.decodable and layer.qk_norm is None and layer.act is F.silu
            and layer.heads % layer.kv_heads == 0 and _power_of_two(layer.head_dim) and layer.head_dim >= 2
            and _power_of_two(slots)):
        return False
    return (layer.head_dim // 2) % plan("qkv_rope", rows, layer.head_dim, 1)["block_p"] == 0


def mlp_supported(layer, rows: int) -> bool:
    """Whether `layer`'s MLP (any PackedLayer with packed gate/up, SiLU, no biases) can run fused."""
    return rows <= MAX_ROWS and layer.decodable and layer.act is F.silu


def mlp(layer, x: torch.Tensor, workspace: DownWorkspace) -> torch.Tensor:
    """x + down(SiLU(gate(norm(x))) * up(norm(x))) of a PackedLayer, as two kernels."""
    hidden = norm_gate_up(x, layer.w_post, layer.eps_post, layer.gate_up, layer.intermediate)
    return down_residual(hidden, layer.mlp.down_proj.weight, x, workspace)


def depth_layer(layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, start: int, workspace: DownWorkspace) -> torch.Tensor:
    """One depth-decoder layer (a PackedLayer without q/k norm) at positions start..start+T-1 of x [R, T, H],
    writing its keys/values into k_cache/v_cache [R, kv, 16, D]; cos/sin [T, D]."""
    t = x.shape[1]
    q = qkv_rope(x, layer.w_in, layer.eps_in, layer.qkv, cos, sin, k_cache, v_cache, start, heads=layer.heads,
                 kv_heads=layer.kv_heads, head_dim=layer.head_dim)
    x = attention_out(q, k_cache, v_cache, start, t, x, layer.attn.o_proj.weight, layer.scale, heads=layer.heads,
                      kv_heads=layer.kv_heads, head_dim=layer.head_dim)
    return mlp(layer, x, workspace)
