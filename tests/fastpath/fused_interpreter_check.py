"""Run by tests/fastpath/test_fused.py in a subprocess with TRITON_INTERPRET=1: the fused kernels
(engine/fastpath/fused.py: the depth layer's, the down-projection kernel also as the output projection,
and the backbone's norm + q/k/v and q/k norm + RoPE, also over a join's prompt) executed by Triton's
interpreter on CPU tensors,
against the same stages in torch, at depth-decoder-like shapes shrunk (odd row counts for the masks, both
step lengths, split-K).
Half-precision cases use FP16 (the T4 policy's weights): the interpreter converts to BF16 by truncation,
not rounding (numpy has no BF16), so a BF16 case would differ from torch by design; one runs with a
tolerance of a few BF16 steps to check it executes. Prints one JSON line per case; exits non-zero if any
case mismatches."""

from __future__ import annotations

import json
import sys

import torch

from breeze_worker.engine.fastpath import fused


def _case(rows: int, t: int, start: int, dtype: torch.dtype, weight_dtype: torch.dtype, seed: int,
          plans: dict, backbone_cache: torch.dtype | None = None) -> dict:
    """`plans`: the case's launch-plan overrides (fused.KernelSettings.plans), the same in both modes.
    `backbone_cache`: the backbone's cache dtype where it differs from the activations' (FP16 beside FP32
    under fp16-mixed)."""
    g = torch.Generator().manual_seed(seed)
    heads, kv, d, hidden, inter, slots = 4, 2, 16, 64, 96, 16

    def rnd(*shape, scale=1.0, to=dtype):
        return (torch.randn(*shape, generator=g) * scale).to(to)

    x = rnd(rows, t, hidden)
    x1 = rnd(rows, t, hidden)  # the MLP's input
    w_in = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    w_post = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    qkv, o_proj = rnd((heads + 2 * kv) * d, hidden, scale=0.2, to=weight_dtype), rnd(hidden, heads * d, scale=0.2,
                                                                                   to=weight_dtype)
    gate_up, down = rnd(2 * inter, hidden, scale=0.2, to=weight_dtype), rnd(hidden, inter, scale=0.2, to=weight_dtype)
    angles = torch.randn(t, d // 2, generator=g)
    cos = torch.cat([angles.cos(), angles.cos()], -1).to(dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1).to(dtype)
    stale = rnd(rows, kv, slots, d)  # last frame's entries: must be masked
    qk_gain = (1 + 0.1 * torch.randn(1, heads + kv, 1, d, generator=g)).to(dtype)
    row_angles = torch.randn(rows, 1, t, d // 2, generator=g)
    cos_rows = torch.cat([row_angles.cos(), row_angles.cos()], -1).to(dtype)
    sin_rows = torch.cat([row_angles.sin(), row_angles.sin()], -1).to(dtype)
    row_slots = (start + 3 * torch.arange(rows)[:, None] + torch.arange(t)[None, :]) % slots
    # a join's prefill: a prompt of 5 positions (not a power of two) per row, slots 0..4 shared by every row
    prompt = 5
    proj_prompt = rnd(rows, prompt, (heads + 2 * kv) * d)
    prompt_angles = torch.randn(rows, 1, prompt, d // 2, generator=g)
    cos_prompt = torch.cat([prompt_angles.cos(), prompt_angles.cos()], -1).to(dtype)
    sin_prompt = torch.cat([prompt_angles.sin(), prompt_angles.sin()], -1).to(dtype)
    mask = torch.where(torch.arange(slots)[None, :] <= start + torch.arange(t)[:, None], 0.0,
                       torch.finfo(torch.float32).min)[None, None]
    cache_dtype = backbone_cache or dtype  # the backbone cache's dtype
    results = {}
    for mode in ("torch", "kernel"):
        ks = fused.KernelSettings(plans=plans, use_triton=mode == "kernel")
        k_cache, v_cache = stale.clone(), stale.clone()
        q = fused.qkv_rope(x, w_in, 1e-5, qkv, cos, sin, k_cache, v_cache, start, heads=heads, kv_heads=kv, head_dim=d,
                           kernels=ks)
        attn = fused.depth_attention(q, k_cache, v_cache, mask, start, scale=d ** -0.5, kernels=ks)
        # both attention kernels at every row count: one program per (row, KV head) and per (row, query head)
        by_kernel = []
        for per_head_rows in (rows + 1, 1):
            by_head = fused.KernelSettings(plans={**plans, "depth_attention": {"per_head_rows": per_head_rows}},
                                           use_triton=mode == "kernel")
            by_kernel.append(fused.depth_attention(q, k_cache, v_cache, mask, start, scale=d ** -0.5,
                                                   kernels=by_head))
        workspace = fused.DownWorkspace()
        # the depth layer's output projection (the down-projection kernel, its own launch plan); its MLP over a
        # fixed input (each stage against its own torch form)
        x2 = fused.down_residual(attn, o_proj, x, workspace, kernel="o_residual", kernels=ks)
        h = fused.norm_gate_up(x1, w_post, 1e-5, gate_up, inter, kernels=ks)
        y = fused.down_residual(h, down, x1, workspace, kernels=ks)
        # the same workspace again (its arrival counters must be back at zero): the same bits
        again = torch.equal(y, fused.down_residual(h, down, x1, workspace, kernels=ks))
        # the "fused+chain+all" form's backbone kernels: norm + q/k/v, then q/k norm + RoPE + a write at each
        # row's own slot (per-row positions and RoPE tables)
        proj = fused.norm_linear(x, w_in, 1e-5, qkv, kernels=ks)
        kb, vb = stale.to(cache_dtype, copy=True), stale.to(cache_dtype, copy=True)
        qb = fused.qk_norm_rope(proj, qk_gain, 1e-6, cos_rows, sin_rows, kb, vb, row_slots, heads=heads, kv_heads=kv,
                                head_dim=d, kernels=ks)
        # the "gemm+attention" form's depth call: one RoPE table and slot list for every row (read with a row
        # stride of 0, not copied per row), no q/k norm
        kd, vd = stale.clone(), stale.clone()
        shared_slots = ((start + torch.arange(t)) % slots)[None]
        qd = fused.qk_norm_rope(proj, None, 0.0, cos[None, None], sin[None, None], kd, vd, shared_slots, heads=heads,
                                kv_heads=kv, head_dim=d, kernels=ks)
        kp, vp = stale.to(cache_dtype, copy=True), stale.to(cache_dtype, copy=True)
        qp = fused.qk_norm_rope(proj_prompt, qk_gain, 1e-6, cos_prompt, sin_prompt, kp, vp,
                                torch.arange(prompt)[None], heads=heads, kv_heads=kv, head_dim=d, kernels=ks)
        results[mode] = (q, k_cache, v_cache, attn, *by_kernel, x2, h, y, proj, qb, kb, vb, qd, kd, vd, qp, kp, vp)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 5e-2}[max(dtype, weight_dtype, key=_coarser)]
    report = {"rows": rows, "t": t, "start": start, "dtype": str(dtype), "weights": str(weight_dtype),
              "backbone_cache": str(cache_dtype),
              "down_splits": fused.plan("down_residual", inter, fused.KernelSettings(plans=plans))["splits"],
              "o_splits": fused.plan("o_residual", heads * d, fused.KernelSettings(plans=plans))["splits"]}
    for name, a, b in zip(("q", "k_cache", "v_cache", "attention", "attention_grouped", "attention_per_head",
                           "o_residual", "hidden", "out", "norm_linear", "backbone_q", "backbone_k_cache",
                           "backbone_v_cache", "shared_rope_q", "shared_rope_k_cache", "shared_rope_v_cache",
                           "prefill_q", "prefill_k_cache", "prefill_v_cache"),
                          results["torch"], results["kernel"]):
        err = ((a.float() - b.float()).abs().max() / a.float().abs().max().clamp(min=1e-6)).item()
        report[name] = err
        report["ok"] = report.get("ok", True) and err <= tol and bool(torch.isfinite(b.float()).all())
    report["workspace_reused_identical"] = again
    report["ok"] = report["ok"] and again
    return report


def _coarser(dtype: torch.dtype) -> int:
    return {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[dtype]


def main() -> int:
    if fused._triton is None:
        print("Triton is not importable", file=sys.stderr)
        return 2
    failed = 0
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
    cases = [(1, 1, 5, f32, f32, 32), (2, 1, 9, f32, f32, 8), (2, 2, 0, f32, f32, 16), (3, 1, 15, f32, f32, 8),
             (5, 1, 3, f16, f16, 8), (4, 2, 0, f32, f16, 32), (2, 1, 7, bf16, bf16, 16)]
    for i, (rows, t, start, dtype, weight_dtype, chunk) in enumerate(cases):
        # fp16-mixed (FP32 activations, FP16 weights): the backbone's cache in FP16, as `half_kv` keeps it
        backbone_cache = f16 if (dtype, weight_dtype) == (f32, f16) else None
        # K = 96 in chunks of 32, 16 or 8 (3, 6, 12 splits) or one chunk of 96's largest power-of-two divisor
        plans = {"down_residual": {"chunk": chunk, "block_n": 16, "evict": i % 2 == 1}, "qkv_rope": {"block_p": 4},
                 "norm_gate_up": {"block_n": 32, "evict": i % 2 == 0}, "o_residual": {"chunk": 2 * chunk, "block_n": 8}}
        report = _case(rows, t, start, dtype, weight_dtype, seed=i, plans=plans, backbone_cache=backbone_cache)
        print(json.dumps(report), flush=True)
        failed += not report["ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
