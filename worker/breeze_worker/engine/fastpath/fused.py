"""Triton kernels for the decoder layers at a few rows, and the depth attention and RoPE for any row count.

Why: at one stream (1-2 model rows) every projection of a decode step is GEMV-shaped and a layer step as
generic kernels is a dozen small launches of 1-2.5 us each around four projections that read their weights
well below bandwidth; the frame has 180 depth-decoder layer steps (12 layers x 15 positions).

- `qkv_rope`: RMSNorm, the q/k/v projection, RoPE on q and k, k and v written straight into their cache
  slot, q into a buffer. A program owns BLOCK_P column pairs (d, d + D/2) of one head, so RoPE is local.
- `depth_attention`: one program per (row, KV head) attends its query heads over the 16 slots; in batched
  steps (plan `per_head_rows` model rows and more) one per (row, query head), smaller programs.
- `down_residual`: a projection plus the residual with K in SPLITS chunks; the partials go to a
  workspace and the last program of a column block to arrive, by an atomic counter, adds them in split
  order, so the result does not depend on arrival order, and resets the counter. It serves the MLP's
  down projection and the attention's output projection (plan "o_residual").
- `norm_gate_up`: RMSNorm, gate and up over the same columns, SiLU(gate) * up (`norm_linear`: ungated,
  the backbone's q/k/v projection).
- `qk_norm_rope`: from a q/k/v projection, the q/k RMSNorm, RoPE and each row's cache write at its own slot
  (the backbone's layers, a join's prefill, and the depth layers of the `gemm+attention` form).
- `depth_head`: a depth position's final RMSNorm, the codebook's head in FP32 and the CFG combination (two
  rows, or three with two guidance scales).

`depth_layer` (the whole depth layer as five of them) and `backbone_layer` (the backbone's, around a
compiled attention) serve the `fused+chain+all` form (fastpath/forms.py). On compute capability >= 9.0 each
launch is chained to the one before by programmatic dependent launch (`pdl`): a kernel starts while the
one before finishes, loads its weights (which nothing writes), then waits (griddepcontrol.wait) before it
reads that kernel's output or writes anything, so the bits are the same chained or not.

Each program loads its whole weight tile (BLOCK rows x the input width, or one K chunk) once and reduces
each input row against it (no loop over K): every load of the program is in flight at once, as in
Inductor's persistent reductions.

Numerics follow the units form stage by stage: FP32 accumulation, each projection's input rounded to the
weight's dtype, its output to the residual stream's dtype. Launch settings are fixed per shape by `plan`
(not timed at start-up): the summation order, hence the rounding, must not change between processes, or
a seed would not give the same audio after a restart. `KernelSettings.plans` (BREEZE_FUSED_CONFIG)
overrides them for measurements.

The kernels themselves are in fastpath/fused_kernels.py; this module holds their launch plans, the
functions that launch them and the same stages in torch. Without Triton, or off CUDA (CI), each stage runs
that torch computation; `TRITON_INTERPRET=1` runs the kernels themselves on CPU tensors
(tests/fastpath/test_fused.py, in a subprocess).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from breeze_worker.config import KernelSettings  # how the kernels launch (BREEZE_FUSED_PDL, BREEZE_FUSED_CONFIG)
from breeze_worker.engine.fastpath.fused_kernels import _HAS_GDC, _triton
from breeze_worker.engine.fastpath.layers import attend_rows, rotate, write_cache

if _triton is not None:  # the kernels (fastpath/fused_kernels.py) these functions launch
    from breeze_worker.engine.fastpath.fused_kernels import (
        _depth_attention_head_kernel,
        _depth_attention_kernel,
        _depth_head_kernel,
        _down_residual_kernel,
        _norm_gate_up_kernel,
        _qk_norm_rope_kernel,
        _qkv_rope_kernel,
    )

MAX_ROWS = 8
_TILE_BUDGET = 8192  # FP32 weight-tile elements per program (64 registers a thread at 4 warps)
_MAX_WIDTH = 4096  # the norm kernels hold a whole input row


DEFAULT_KERNELS = KernelSettings()


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (Triton's own switch, read before it is imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


_pdl_devices: dict[int, bool] = {}


def available(device: torch.device, kernels: KernelSettings = DEFAULT_KERNELS) -> bool:
    """Whether the kernels run for tensors on `device` (CUDA with Triton; the CPU under the interpreter)."""
    if _triton is None or not kernels.use_triton:
        return False
    return device.type == "cuda" or (interpreting() and device.type == "cpu")


def pdl(device: torch.device, kernels: KernelSettings = DEFAULT_KERNELS) -> bool:
    """Whether the kernels launch chained (programmatic dependent launch) on `device`: each starts while
    the kernel before it finishes, loads its weights, and waits (griddepcontrol.wait) before it reads
    that kernel's output. Needs compute capability >= 9.0 and a Triton with griddepcontrol; never in the
    interpreter; `kernels.chained` False turns it off. The arithmetic is the same either way."""
    if not kernels.chained or device.type != "cuda" or _triton is None or not _HAS_GDC or interpreting():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _pdl_devices:
        _pdl_devices[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return _pdl_devices[index]


def _launch(device: torch.device, kernels: KernelSettings) -> dict:
    """The launch arguments that chain a kernel (see `pdl`)."""
    return {"USE_PDL": True, "launch_pdl": True} if pdl(device, kernels) else {"USE_PDL": False}


def _next_power_of_two(n: int) -> int:
    pad = 1
    while pad < n:
        pad *= 2
    return pad


# launch settings by input width where a shape timed faster with others than the defaults: the backbone's
# (K 2048, the MLP's 6144) and the depth MLP's down projection (K 8192, in one chunk)
_BY_WIDTH = {
    ("norm_linear", 2048): {"block_n": 4, "num_warps": 4, "evict": True},
    ("o_residual", 2048): {"block_n": 2, "chunk": 2048, "num_warps": 2, "evict": False},
    ("norm_gate_up", 2048): {"block_n": 2, "num_warps": 4, "evict": True},
    ("down_residual", 8192): {"block_n": 1, "chunk": 8192, "num_warps": 8, "evict": True},
}


def plan(kernel: str, k: int, kernels: KernelSettings = DEFAULT_KERNELS) -> dict:
    """Fixed launch settings of `kernel` whose inputs are `k` wide (module docstring: fixed, not timed, so
    the rounding never changes between processes); `kernels.plans` may override them, by kernel
    ("norm_gate_up") or by kernel and width ("norm_gate_up@2048"). The defaults are the fastest
    candidates measured on an H200 at 2 rows ("evict": the weight loads hinted evict-first, a cache hint with the
    same arithmetic), and at the backbone's widths `_BY_WIDTH`. A program holds its weight tile, BLOCK x (K or
    CHUNK) values in FP32, within _TILE_BUDGET."""
    width = _next_power_of_two(k)
    if kernel == "qkv_rope":
        cfg = {"block_p": 4, "num_warps": 2}
    elif kernel == "norm_gate_up":
        cfg = {"block_n": 4, "num_warps": 2, "evict": True}
    elif kernel == "down_residual":
        cfg = {"block_n": 2, "chunk": 2048, "num_warps": 4, "evict": True}
    elif kernel == "o_residual":  # the same kernel as down_residual, for the attention's output projection
        cfg = {"block_n": 2, "chunk": 1024, "num_warps": 2, "evict": False}
    elif kernel == "norm_linear":  # norm_gate_up's kernel ungated: the backbone's q/k/v projection
        cfg = {"block_n": 4, "num_warps": 2, "evict": True}
    elif kernel == "depth_attention":
        # one program per (row, KV head), or from `per_head_rows` model rows on one per (row, query head): with
        # many rows the grouped kernel's [GROUP, SLOTS, D] products make its programs slow; batch 1 keeps it
        cfg = {"num_warps": 4, "per_head_rows": 3, "head_warps": 2}
    elif kernel == "depth_head":
        cfg = {"block_v": 8, "num_warps": 4}
    elif kernel == "sample":  # fused_sampling.py's kernel (`k`: the vocabulary)
        cfg = {"num_warps": 8}
    else:
        raise ValueError(f"unknown fused kernel {kernel!r}")
    cfg.update(_BY_WIDTH.get((kernel, k), {}))
    for key in (kernel, f"{kernel}@{k}"):
        cfg.update(kernels.plans.get(key, {}))
    if kernel in ("depth_head", "depth_attention", "sample"):
        return cfg
    if kernel in ("down_residual", "o_residual"):  # K = splits x chunk, chunk a power of two
        cfg["chunk"] = min(cfg["chunk"], k & -k)
        cfg["splits"] = k // cfg["chunk"]
        width = cfg["chunk"]
    key = "block_p" if kernel == "qkv_rope" else "block_n"
    tiles = 1 if kernel in ("down_residual", "o_residual", "norm_linear") else 2
    while cfg[key] > 1 and cfg[key] * width * tiles > _TILE_BUDGET:
        cfg[key] //= 2
    return cfg


# ---- the kernels' stages; each is also written in torch (the CPU path and the reference) ----

def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(dtype)


def _linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return F.linear(x.to(weight.dtype).float(), weight.float()).to(out_dtype)


def qkv_rope(x: torch.Tensor, w_norm: torch.Tensor, eps: float, qkv: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, *, heads: int,
             kv_heads: int, head_dim: int, kernels: KernelSettings = DEFAULT_KERNELS) -> torch.Tensor:
    """x [R, T, H] -> q [R, heads, T, D] (a view); k and v [R, kv, T, D] written into the caches [R, kv, L, D]
    at slots start..start+T-1. cos/sin [T, D] (the tables of those positions)."""
    rows, t, hidden = x.shape
    dtype = x.dtype
    if not available(x.device, kernels):
        proj = _linear(_rms(x, w_norm, eps, qkv.dtype), qkv, dtype).view(rows, t, heads + 2 * kv_heads, head_dim)
        proj = proj.transpose(1, 2).float()  # [R, heads + 2kv, T, D]
        qk, v = proj[:, :heads + kv_heads], proj[:, heads + kv_heads:]
        qk = rotate(qk, cos.float()[None, None], sin.float()[None, None])
        k_cache[:, :, start:start + t] = qk[:, heads:].to(k_cache.dtype)
        v_cache[:, :, start:start + t] = v.to(v_cache.dtype)
        return qk[:, :heads].to(dtype)
    _check_cache(k_cache, v_cache, head_dim)
    cfg = plan("qkv_rope", hidden, kernels)
    q = torch.empty(rows, t, heads, head_dim, dtype=dtype, device=x.device)
    grid = ((heads + 2 * kv_heads) * (head_dim // 2) // cfg["block_p"],)
    _qkv_rope_kernel[grid](x.contiguous(), w_norm, qkv, cos.contiguous(), sin.contiguous(), q, k_cache, v_cache,
                           hidden, start, eps, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), M=rows * t,
                           T=t, HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim, BLOCK_P=cfg["block_p"],
                           HP=_next_power_of_two(hidden), num_warps=cfg["num_warps"],
                           **_launch(x.device, kernels))
    return q.transpose(1, 2)


def depth_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor, start: int, *,
                    scale: float, kernels: KernelSettings = DEFAULT_KERNELS) -> torch.Tensor:
    """q [R, heads, T, D] (from `qkv_rope`) over the cache [R, kv, L, D] (slots after start + t masked; `mask`
    is the same as an additive [1, 1, T, L] tensor, used by the torch form) -> [R, T, heads * D]."""
    rows, heads, t, d = q.shape
    if not available(q.device, kernels):
        return attend_rows(q, k_cache, v_cache, mask, scale, reduce=True)
    _check_cache(k_cache, v_cache, d)
    kv_heads, slots = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty(rows, t, heads * d, dtype=v_cache.dtype, device=q.device)
    q_rows = q.transpose(1, 2).contiguous()  # [R, T, heads, D]: qkv_rope's buffer as it is (no copy)
    cfg = plan("depth_attention", d, kernels)
    per_head = rows >= cfg["per_head_rows"]
    kernel = _depth_attention_head_kernel if per_head else _depth_attention_kernel
    kernel[(rows * t, heads if per_head else kv_heads)](
        q_rows, k_cache, v_cache, out, start, scale, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), T=t,
        HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=d, SLOTS=slots,
        num_warps=cfg["head_warps"] if per_head else cfg["num_warps"], **_launch(q.device, kernels))
    return out


def norm_gate_up(x: torch.Tensor, w_norm: torch.Tensor, eps: float, gate_up: torch.Tensor, intermediate: int,
                 kernels: KernelSettings = DEFAULT_KERNELS) -> torch.Tensor:
    """SiLU(gate(norm(x))) * up(norm(x)) for x [R, T, H] -> [R, T, I]."""
    rows, t, hidden = x.shape
    if not available(x.device, kernels):
        normed = _rms(x, w_norm, eps, gate_up.dtype)
        gate = _linear(normed, gate_up[:intermediate], x.dtype).float()
        up = _linear(normed, gate_up[intermediate:], x.dtype).float()
        return (F.silu(gate) * up).to(x.dtype)
    out = torch.empty(rows, t, intermediate, dtype=x.dtype, device=x.device)
    _gate_up_launch(plan("norm_gate_up", hidden, kernels), x, w_norm, gate_up, out, intermediate, eps, gated=True,
                    kernels=kernels)
    return out


def _gate_up_launch(cfg: dict, x: torch.Tensor, w_norm: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
                    n: int, eps: float, gated: bool, kernels: KernelSettings) -> None:
    """One program per block of `block_n` output columns."""
    rows, t, hidden = x.shape
    _norm_gate_up_kernel[(-(-n // cfg["block_n"]),)](
        x.contiguous(), w_norm, weight, out, hidden, n, eps, M=rows * t, BLOCK_N=cfg["block_n"],
        HP=_next_power_of_two(hidden), EVICT=cfg["evict"], GATED=gated, num_warps=cfg["num_warps"],
        **_launch(x.device, kernels))


def norm_linear(x: torch.Tensor, w_norm: torch.Tensor, eps: float, weight: torch.Tensor,
                kernels: KernelSettings = DEFAULT_KERNELS) -> torch.Tensor:
    """weight(norm(x)) for x [R, T, H] -> [R, T, N] (`norm_gate_up`'s kernel, ungated)."""
    rows, t, hidden = x.shape
    n = weight.shape[0]
    if not available(x.device, kernels):
        return _linear(_rms(x, w_norm, eps, weight.dtype), weight, x.dtype)
    out = torch.empty(rows, t, n, dtype=x.dtype, device=x.device)
    _gate_up_launch(plan("norm_linear", hidden, kernels), x, w_norm, weight, out, n, eps, gated=False,
                    kernels=kernels)
    return out


def depth_head_wanted(device: torch.device, hidden: int, kernels: KernelSettings = DEFAULT_KERNELS) -> bool:
    """Whether `depth_head` runs its kernel: the kernels available on `device`, inputs no wider than _MAX_WIDTH."""
    return available(device, kernels) and hidden <= _MAX_WIDTH


def depth_head(x: torch.Tensor, w_norm: torch.Tensor, eps: float, head: torch.Tensor, cond_row: torch.Tensor,
               uncond_row: torch.Tensor, cfg_scale: torch.Tensor,
               kernels: KernelSettings = DEFAULT_KERNELS, ref_row: torch.Tensor | None = None,
               ref_scale: torch.Tensor | None = None) -> torch.Tensor:
    """A depth position's stream logits [S, V] (FP32) from the last layer's output at that position x [R, H]
    (rows may be strided): the final RMSNorm, the codebook's head `head` [H, V] in FP32, CFG u + s * (c - u)
    over the streams' rows `cond_row`/`uncond_row` [S] with `cfg_scale` [S] (FrameStep._depth_logits); with
    `ref_row` and `ref_scale` [S] (two guidance scales; a stream without a third row has ref_row == uncond_row)
    u + ref_scale * (r - u) + s * (c - u)."""
    rows, hidden = x.shape
    vocab = head.shape[1]
    streams = cond_row.shape[0]
    if (ref_row is None) != (ref_scale is None):
        raise ValueError("depth_head takes ref_row and ref_scale together")
    if not available(x.device, kernels):
        normed = _rms(x, w_norm, eps, head.dtype).float()
        logits = normed @ head.float()
        cond, uncond = logits[cond_row], logits[uncond_row]
        if ref_row is None or ref_scale is None:
            return uncond + cfg_scale[:, None] * (cond - uncond)
        return uncond + ref_scale[:, None] * (logits[ref_row] - uncond) + cfg_scale[:, None] * (cond - uncond)
    if x.stride(1) != 1 or not head.is_contiguous():
        raise ValueError("depth_head needs unit-stride rows and a contiguous head [H, V]")
    if ref_row is None or ref_scale is None:  # no third rows: each stream's ref row is its uncond row
        ref_row, ref_scale = uncond_row, cfg_scale
    cfg = plan("depth_head", hidden, kernels)
    out = torch.empty(streams, vocab, dtype=torch.float32, device=x.device)
    _depth_head_kernel[(-(-vocab // cfg["block_v"]),)](x, x.stride(0), w_norm, head, cond_row, uncond_row,
                                                       cfg_scale, ref_row, ref_scale, out, hidden, vocab, eps,
                                                       STREAMS=streams, BLOCK_V=cfg["block_v"],
                                                       HP=_next_power_of_two(hidden), num_warps=cfg["num_warps"],
                                                       **_launch(x.device, kernels))
    return out


def qk_norm_rope(proj: torch.Tensor, qk_norm: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, *, heads: int, kv_heads: int,
                 head_dim: int, kernels: KernelSettings = DEFAULT_KERNELS) -> torch.Tensor:
    """The q/k/v projection [R, T, (heads + 2kv) * D] -> q [R, heads, T, D] (a view): q and k RMS-normed per
    head (`qk_norm` [1, heads + kv, 1, D] gains, or none), RoPE (cos/sin [R or 1, 1, T, D]); k and v written
    into the caches [R, kv, L, D] at `slots` int64 [R or 1, T] (each row its own slot: the backbone)."""
    rows, t, _ = proj.shape
    dtype = proj.dtype
    if not available(proj.device, kernels):
        out = proj.view(rows, t, heads + 2 * kv_heads, head_dim).transpose(1, 2).float()
        qk, v = out[:, :heads + kv_heads], out[:, heads + kv_heads:]
        if qk_norm is not None:  # layers.rms_norm with per-head gains: rounded, times the gain, rounded
            normed = (qk * torch.rsqrt(qk.pow(2).mean(-1, keepdim=True) + eps)).to(dtype).float()
            qk = (normed * qk_norm.float()).to(dtype).float()
        qk = rotate(qk, cos.float(), sin.float())
        write_cache(k_cache, v_cache, slots, qk[:, heads:], v)
        return qk[:, :heads].to(dtype)
    _check_cache(k_cache, v_cache, head_dim)
    q = torch.empty(rows, t, heads, head_dim, dtype=dtype, device=proj.device)
    norm = qk_norm.reshape(-1, head_dim).contiguous() if qk_norm is not None else proj
    # one table (or slot list) for every row, as the depth decoder's: read with a row stride of 0, not copied
    # per row (three copy kernels a layer otherwise)
    cos_rows, rope_stride = _rows_view(cos, rows, (t, head_dim))
    sin_rows, sin_stride = _rows_view(sin, rows, (t, head_dim))
    if sin_stride != rope_stride:  # one stride serves both tables
        cos_rows = cos.expand(rows, 1, t, head_dim).contiguous()
        sin_rows = sin.expand(rows, 1, t, head_dim).contiguous()
        rope_stride = cos_rows.stride(0)
    slot_rows, slot_stride = _rows_view(slots, rows, (t,))
    _qk_norm_rope_kernel[(rows * t, heads + 2 * kv_heads)](
        proj.contiguous(), norm, cos_rows, sin_rows, slot_rows, q, k_cache, v_cache, eps, rope_stride,
        slot_stride, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), T=t, HEADS=heads,
        KV_HEADS=kv_heads, HEAD_DIM=head_dim, HAS_NORM=qk_norm is not None, num_warps=1,
        **_launch(proj.device, kernels))
    return q.transpose(1, 2)


def _rows_view(table: torch.Tensor, rows: int, inner: tuple[int, ...]) -> tuple[torch.Tensor, int]:
    """A per-row table [R or 1, ..., *inner] for a kernel that reads row r at r * stride: a table shared by
    every row as it is with stride 0; else contiguous (copied only when it is not) with its row stride."""
    if table.shape[0] == 1 and rows > 1:
        shared = table.reshape(*inner)
        return (shared, 0) if shared.is_contiguous() else (shared.contiguous(), 0)
    full = table.expand(rows, *table.shape[1:]).contiguous()
    return full, full.stride(0)


class DownWorkspace:
    """Partial sums and arrival counters of `down_residual`, one set per (device, shape): allocated by the
    warm-up call before graph capture. One FrameStep owns one and its layers share it (they run one after
    another on one stream); steps that may run concurrently must not share one."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, device: torch.device, splits: int, rows: int, n: int,
            blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (str(device), splits, rows, n, blocks)
        if key not in self._buffers:
            self._buffers[key] = (torch.empty(splits, rows, n, dtype=torch.float32, device=device),
                                  torch.zeros(blocks, dtype=torch.int32, device=device))
        return self._buffers[key]

    def reserve_like(self, other: DownWorkspace) -> None:
        """Allocate every buffer `other` holds: a step whose warm-up ran on another step (a scratch of its
        shape, engine/batch_graphs.py) is captured without one, and a buffer first allocated inside the
        capture would be the graph's own."""
        for device, splits, rows, n, blocks in list(other._buffers):
            self.get(torch.device(device), splits, rows, n, blocks)


def down_residual(hidden: torch.Tensor, down: torch.Tensor, x: torch.Tensor, workspace: DownWorkspace,
                  kernel: str = "down_residual", kernels: KernelSettings = DEFAULT_KERNELS) -> torch.Tensor:
    """x + down(hidden), hidden [R, T, I], x [R, T, H]. `kernel` names the launch plan ("o_residual": the
    attention's output projection, the same kernel)."""
    rows, t, k = hidden.shape
    n = down.shape[0]
    if not available(x.device, kernels):
        return (x.float() + _linear(hidden, down, x.dtype).float()).to(x.dtype)
    cfg = plan(kernel, k, kernels)
    blocks = -(-n // cfg["block_n"])
    partials, counts = workspace.get(x.device, cfg["splits"], rows * t, n, blocks)
    y = torch.empty_like(x)
    _down_residual_kernel[(blocks, cfg["splits"])](
        hidden.contiguous(), down, x.contiguous(), y, partials, counts, n, k, M=rows * t, BLOCK_N=cfg["block_n"],
        CHUNK=cfg["chunk"], SPLITS=cfg["splits"], EVICT=cfg["evict"], num_warps=cfg["num_warps"],
        **_launch(x.device, kernels))
    return y


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, head_dim: int) -> None:
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1 or k_cache.shape[3] != head_dim:
        raise ValueError("the fused kernels need key/value caches [R, kv, L, D] of one layout, unit stride along D")


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def supported(layer, rows: int, slots: int, kernels: KernelSettings = DEFAULT_KERNELS) -> bool:
    """Whether `layer` (a PackedLayer) can run `depth_layer` at `rows` rows (rows times positions) over
    `slots` cache slots: a Llama-style layer (no q/k norm, SiLU, no biases) whose head size, query heads
    per KV head and slot count are powers of two (Triton block shapes), the head half a multiple of the
    column-pair block, and inputs no wider than _MAX_WIDTH."""
    if not (mlp_supported(layer, rows) and layer.qk_norm is None and layer.heads % layer.kv_heads == 0
            and layer.head_dim >= 2 and _power_of_two(layer.head_dim)
            and _power_of_two(layer.heads // layer.kv_heads) and _power_of_two(slots)):
        return False
    return (layer.head_dim // 2) % plan("qkv_rope", layer.qkv.shape[1], kernels)["block_p"] == 0


def mlp_supported(layer, rows: int) -> bool:
    """Whether `layer`'s MLP (any PackedLayer with packed gate/up, SiLU, no biases) can run fused."""
    return (rows <= MAX_ROWS and layer.decodable and layer.act is F.silu
            and layer.gate_up.shape[1] <= _MAX_WIDTH)


def qk_norm_rope_supported(head_dim: int) -> bool:
    """Whether `qk_norm_rope`'s kernel takes heads of `head_dim` (its two halves are Triton blocks: a power of
    two of at least 2)."""
    return head_dim >= 2 and _power_of_two(head_dim)


def backbone_supported(layer, rows: int) -> bool:
    """Whether `backbone_layer` applies: `mlp_supported`, packed q/k/v, a power-of-two head size."""
    return (mlp_supported(layer, rows) and layer.qkv is not None and layer.qkv.shape[1] <= _MAX_WIDTH
            and qk_norm_rope_supported(layer.head_dim))


def backbone_layer(layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor, attend, workspace: DownWorkspace,
                   kernels: KernelSettings = DEFAULT_KERNELS) -> torch.Tensor:
    """One backbone layer (a PackedLayer, q/k norm or not) of x [R, T, H] as this module's kernels around
    `attend` (layers.attend_rows or its compiled form, as FP32 reductions) over the caches [R, kv, L, D]: norm + q/k/v,
    q/k norm + RoPE + cache write at `slots` [R or 1, T], attention, output projection + residual, MLP."""
    proj = norm_linear(x, layer.w_in, layer.eps_in, layer.qkv, kernels)
    q = qk_norm_rope(proj, layer.qk_norm, layer.qk_eps, cos, sin, k_cache, v_cache, slots, heads=layer.heads,
                     kv_heads=layer.kv_heads, head_dim=layer.head_dim, kernels=kernels)
    out = attend(q, k_cache, v_cache, mask, layer.scale, reduce=True)
    x = down_residual(out, layer.attn.o_proj.weight, x, workspace, kernel="o_residual", kernels=kernels)
    return mlp(layer, x, workspace, kernels)


def mlp(layer, x: torch.Tensor, workspace: DownWorkspace, kernels: KernelSettings = DEFAULT_KERNELS) -> torch.Tensor:
    """x + down(SiLU(gate(norm(x))) * up(norm(x))) of a PackedLayer, as two kernels."""
    hidden = norm_gate_up(x, layer.w_post, layer.eps_post, layer.gate_up, layer.intermediate, kernels)
    return down_residual(hidden, layer.mlp.down_proj.weight, x, workspace, kernels=kernels)


def depth_layer(layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, start: int, mask: torch.Tensor, workspace: DownWorkspace,
                kernels: KernelSettings = DEFAULT_KERNELS) -> torch.Tensor:
    """One depth-decoder layer (a PackedLayer without q/k norm) at positions start..start+T-1 of x [R, T, H] as
    five kernels, each launch chained to the one before (`pdl`): `qkv_rope` writes this step's keys/values
    into k_cache/v_cache [R, kv, 16, D] (cos/sin [T, D]), `depth_attention`, the output projection plus
    residual as `down_residual`'s kernel, and `mlp`. `mask`: additive [1, 1, T, 16] (the torch stages')."""
    q = qkv_rope(x, layer.w_in, layer.eps_in, layer.qkv, cos, sin, k_cache, v_cache, start, heads=layer.heads,
                 kv_heads=layer.kv_heads, head_dim=layer.head_dim, kernels=kernels)
    attn = depth_attention(q, k_cache, v_cache, mask, start, scale=layer.scale, kernels=kernels)
    x = down_residual(attn, layer.attn.o_proj.weight, x, workspace, kernel="o_residual", kernels=kernels)
    return mlp(layer, x, workspace, kernels)
