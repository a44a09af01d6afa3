"""The depth decoder's layer kernels at batch 1 with CFG (2 rows), launched a few times each, for Nsight Compute
(results/NOTES.md run 42): scripts/gpu_ncu_mlp.sh profiles them one by one (throughput against the
memory ceiling, occupancy, registers, warp stall reasons). Weights: 4 layers of seeded random BF16 at the
full-size shapes (more than L2 holds), so each launch reads its weights from memory.

    PYTHONPATH=worker:client:protos:scripts python3 scripts/gpu_ncu_mlp.py
"""

from __future__ import annotations

import torch

from breeze_worker.engine.fastpath import fused

LAYERS = 4


@torch.no_grad()
def main() -> int:
    gen = torch.Generator(device="cuda").manual_seed(3)

    def w(*shape):
        return (0.02 * torch.randn(*shape, generator=gen, device="cuda")).to(torch.bfloat16)

    hidden, inter, heads, kv, d = 1024, 8192, 8, 2, 128
    layers = [{"gate_up": w(2 * inter, hidden), "down": w(hidden, inter), "qkv": w((heads + 2 * kv) * d, hidden),
               "o": w(hidden, heads * d), "norm": (1 + w(hidden)).contiguous()} for _ in range(LAYERS)]
    x = torch.randn(2, 1, hidden, generator=gen, device="cuda").to(torch.bfloat16)
    k_cache = torch.zeros(2, kv, 16, d, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    cos = torch.ones(1, d, device="cuda", dtype=torch.bfloat16)
    sin = torch.zeros(1, d, device="cuda", dtype=torch.bfloat16)
    mask = torch.zeros(1, 1, 1, 16, device="cuda")
    workspace = fused.DownWorkspace()
    for _ in range(3):
        for layer in layers:
            q = fused.qkv_rope(x, layer["norm"], 1e-5, layer["qkv"], cos, sin, k_cache, v_cache, 3, heads=heads,
                               kv_heads=kv, head_dim=d)
            attn = fused.depth_attention(q, k_cache, v_cache, mask, 3, scale=d ** -0.5)
            y = fused.down_residual(attn, layer["o"], x, workspace, kernel="o_residual")
            h = fused.norm_gate_up(y, layer["norm"], 1e-5, layer["gate_up"], inter)
            fused.down_residual(h, layer["down"], y, workspace)
    torch.cuda.synchronize()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
