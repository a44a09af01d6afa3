"""GPU check and timing of the backbone layer as fused kernels (engine/fastpath/fused.py `backbone_layer`, the
`fused+chain+all` form) at the full-size backbone's shapes (hidden 2048, 16 heads / 8 KV heads of 128 with
q/k norm, MLP 6144), against the units+attn form's layer (its fallback). Launch plans tuned only at the depth
decoder's shapes left `fused+chain+all` slower per frame; this script finds plans for these.

1. correctness: `backbone_layer` with the kernels vs its torch stages and vs the default form's layer
   (units+attn, uncompiled), FP32 and BF16, 1-8 rows, each row at its own position and cache slot; chained == unchained
   bits; repeated runs bit-identical.
2. launch settings at these shapes (norm_linear K 2048 -> 4096, o_residual K 2048, norm_gate_up K 2048 ->
   2 x 6144, down_residual K 6144), each over the layers in one CUDA graph; the fastest (the default wins
   ties within 2%) to --best-out as BREEZE_FUSED_CONFIG JSON.
3. the layer step at 2 rows over 256 slots: units+attn (compiled) vs `backbone_layer` chained, unchained and
   with the best settings.

    BREEZE_COMMIT=<sha> PYTHONPATH=worker python3 scripts/gpu_backbone.py --json out.json --best-out best.json
    TRITON_INTERPRET=1 PYTHONPATH=worker python3 scripts/gpu_backbone.py --dry-run   (CPU, tiny config: part 1)
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import gpu_fused
from breeze_worker.engine.fastpath import fused
from breeze_worker.engine.fastpath.compiled import compile_unit
from breeze_worker.engine.fastpath.layers import PLAIN_UNITS, LayerUnits, attend_rows
from breeze_worker.engine.fastpath.settings import FastPathSettings
from breeze_worker.model.lm.backbone import qwen3_layer
from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.lm.rope import RotaryEmbedding

SLOTS = 256
DEVICE = "cuda"
CANDIDATES = {
    "norm_linear": [{"block_n": n, "num_warps": w, "evict": e}
                    for n in (1, 2, 4) for w in (2, 4) for e in (False, True)],
    "o_residual": [{"block_n": n, "chunk": c, "num_warps": w} for n, c in ((1, 2048), (2, 2048), (2, 1024), (4, 1024),
                                                                           (4, 512), (8, 512))
                   for w in (2, 4)],
    "norm_gate_up": [{"block_n": n, "num_warps": w, "evict": e}
                     for n in (1, 2) for w in (2, 4, 8) for e in (False, True)],
    "down_residual": [{"block_n": n, "chunk": c, "num_warps": w, "evict": True} for n, c in ((1, 2048), (2, 2048),
                                                                                          (2, 1024), (4, 1024),
                                                                                          (4, 512), (8, 512))
                      for w in (4, 8)],
}


class Backbone:
    """Full-size (or tiny) backbone layers, packed, with RoPE tables and per-row caches, slots and masks."""

    def __init__(self, dtype: torch.dtype, layers: int, size: str = "full", seed: int = 0):
        cfg = (BreezeConfig.full_size() if size == "full" else BreezeConfig.tiny()).backbone
        self.cfg, self.dtype = cfg, dtype
        self.layers = gpu_fused.seeded_layers(qwen3_layer, cfg, layers, dtype, seed)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta).to(DEVICE)

    def inputs(self, rows: int, seed: int):
        """x [R, 1, H]; per-row positions (cos/sin [R, 1, 1, D]), write slots [R, 1], additive mask [R, 1, 1, L]
        (slots up to each row's own written), and stale caches per layer [R, kv, L, D]."""
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        cfg = self.cfg
        x = torch.randn(rows, 1, cfg.hidden_size, generator=gen, device=DEVICE).to(self.dtype)
        slots = (40 + 17 * torch.arange(rows, device=DEVICE))[:, None] % SLOTS
        cos, sin = self.rotary(slots + 3, self.dtype)  # [R, 1, D]: each row its own position
        cos, sin = cos[:, None], sin[:, None]
        allowed = torch.arange(SLOTS, device=DEVICE)[None, :] <= slots
        mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[:, None, None, :].contiguous()
        shape = (rows, cfg.num_key_value_heads, SLOTS, cfg.head_dim)
        caches = [(torch.randn(shape, generator=gen, device=DEVICE).to(self.dtype),
                   torch.randn(shape, generator=gen, device=DEVICE).to(self.dtype)) for _ in self.layers]
        return x, cos, sin, slots, mask, caches


def run_default(bb: Backbone, x, cos, sin, slots, mask, caches, units: LayerUnits = PLAIN_UNITS):
    """The units+attn form's backbone layers (the fallback of `fused+chain+all`)."""
    for layer, (k, v) in zip(bb.layers, caches):
        x = layer.decode_units(x, cos, sin, k, v, slots, mask, units, small_rows=True)
    return x


def run_fused(bb: Backbone, x, cos, sin, slots, mask, caches, workspace, attend=attend_rows,
              ks: fused.KernelSettings = fused.DEFAULT_KERNELS):
    for layer, (k, v) in zip(bb.layers, caches):
        x = fused.backbone_layer(layer, x, cos, sin, k, v, slots, mask, attend, workspace, ks)
    return x


@torch.no_grad()
def check(bb: Backbone, rows: int) -> dict:
    x, cos, sin, slots, mask, stale = bb.inputs(rows, seed=rows)
    results = {}
    settings = {"torch": fused.KernelSettings(use_triton=False), "unchained": fused.KernelSettings(chained=False)}
    for mode in ("kernel", "kernel-again", "unchained", "torch", "default"):
        caches = [(k.clone(), v.clone()) for k, v in stale]
        if mode == "default":
            y = run_default(bb, x, cos, sin, slots, mask, caches)
        else:
            y = run_fused(bb, x, cos, sin, slots, mask, caches, fused.DownWorkspace(),
                          ks=settings.get(mode, fused.DEFAULT_KERNELS))
        index = slots[:, None, :, None].expand(-1, bb.cfg.num_key_value_heads, 1, bb.cfg.head_dim)
        written = torch.cat([torch.cat([k.gather(2, index), v.gather(2, index)]) for k, v in caches])  # this step's
        results[mode] = (y, written)
    rel = gpu_fused.rel
    out = {"rows": rows, "dtype": str(bb.dtype).replace("torch.", ""), "pdl": fused.pdl(torch.device(DEVICE))}
    out["vs_torch_out"] = rel(results["kernel"][0], results["torch"][0])
    out["vs_torch_cache"] = rel(results["kernel"][1], results["torch"][1])
    out["vs_default_out"] = rel(results["kernel"][0], results["default"][0])
    out["torch_vs_default_out"] = rel(results["torch"][0], results["default"][0])
    out["repeat_identical"] = bool(torch.equal(results["kernel"][0], results["kernel-again"][0]))
    out["chain_identical"] = bool(torch.equal(results["kernel"][0], results["unchained"][0])
                                  and torch.equal(results["kernel"][1], results["unchained"][1]))
    out["finite"] = bool(torch.isfinite(results["kernel"][0]).all())
    bound = 1e-5 if bb.dtype == torch.float32 else 3e-2
    out["ok"] = (out["finite"] and out["repeat_identical"] and out["chain_identical"] and out["vs_torch_out"] <= bound
                 and out["vs_torch_cache"] <= bound
                 and out["vs_default_out"] <= max(bound, 2 * out["torch_vs_default_out"]))
    return out


@torch.no_grad()
def tune(bb: Backbone, bandwidth: float, rows: int = 2) -> tuple[dict, dict]:
    x, cos, sin, slots, mask, caches = bb.inputs(rows, seed=5)
    cfg = bb.cfg
    gen = torch.Generator(device=DEVICE).manual_seed(6)
    attn = torch.randn(rows, 1, cfg.num_attention_heads * cfg.head_dim, generator=gen, device=DEVICE).to(bb.dtype)
    hidden = torch.randn(rows, 1, cfg.intermediate_size, generator=gen, device=DEVICE).to(bb.dtype)
    workspace = fused.DownWorkspace()
    calls = {  # each takes the launch settings (fused.KernelSettings) to time
        "norm_linear": lambda ks: [fused.norm_linear(x, l.w_in, l.eps_in, l.qkv, ks) for l in bb.layers],
        "o_residual": lambda ks: [fused.down_residual(attn, l.attn.o_proj.weight, x, workspace, kernel="o_residual",
                                                      kernels=ks) for l in bb.layers],
        "norm_gate_up": lambda ks: [fused.norm_gate_up(x, l.w_post, l.eps_post, l.gate_up, l.intermediate, ks)
                                    for l in bb.layers],
        "down_residual": lambda ks: [fused.down_residual(hidden, l.mlp.down_proj.weight, x, workspace, kernels=ks)
                                     for l in bb.layers],
    }
    layer = bb.layers[0]
    size = layer.qkv.element_size()
    floors = {name: n * size / bandwidth * 1e6 for name, n in (
        ("norm_linear", layer.qkv.numel()), ("o_residual", layer.attn.o_proj.weight.numel()),
        ("norm_gate_up", layer.gate_up.numel()), ("down_residual", layer.mlp.down_proj.weight.numel()))}
    widths = {"norm_linear": cfg.hidden_size, "o_residual": cfg.hidden_size, "norm_gate_up": cfg.hidden_size,
              "down_residual": cfg.intermediate_size}
    return gpu_fused.time_candidates(CANDIDATES, calls, floors, widths, len(bb.layers))


@torch.no_grad()
def layer_steps(bb: Backbone, best: dict, rows: int = 2) -> dict:
    x, cos, sin, slots, mask, caches = bb.inputs(rows, seed=9)
    workspace = fused.DownWorkspace()
    units = LayerUnits.wrapped(lambda fn: compile_unit(fn, FastPathSettings()))
    n = len(bb.layers)
    row = {"rows": rows, "slots": SLOTS, "layers": n}
    t0 = time.perf_counter()
    run_default(bb, x, cos, sin, slots, mask, caches, units)  # compile outside the graph
    run_fused(bb, x, cos, sin, slots, mask, caches, workspace, units.attend)
    row["compile_s"] = time.perf_counter() - t0
    row["default_us"] = gpu_fused.graph_ms(lambda: run_default(bb, x, cos, sin, slots, mask, caches, units)) * 1000 / n
    for key, ks in (("fused", fused.DEFAULT_KERNELS), ("fused_unchained", fused.KernelSettings(chained=False)),
                    ("fused_best", fused.KernelSettings(plans=best))):
        row[f"{key}_us"] = gpu_fused.graph_ms(
            lambda: run_fused(bb, x, cos, sin, slots, mask, caches, workspace, units.attend, ks)) * 1000 / n
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    global DEVICE
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--best-out", default=None)
    parser.add_argument("--layers", type=int, default=8, help="layers per CUDA graph (the model has 28)")
    parser.add_argument("--skip-tune", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="CPU, TRITON_INTERPRET=1: the checks, tiny config")
    args = parser.parse_args()
    if args.dry_run:
        DEVICE = gpu_fused.DEVICE = "cpu"  # seeded_layers and graph_ms read gpu_fused.DEVICE
        ok = True
        for dtype in (torch.float32, torch.bfloat16):
            bb = Backbone(dtype, layers=2, size="tiny")
            for rows in (1, 2, 3):
                row = check(bb, rows)
                print(json.dumps(row), flush=True)
                ok = ok and (row["ok"] or dtype != torch.float32)  # the interpreter truncates BF16 (see tests)
        return 0 if ok else 1
    assert fused.available(torch.device("cuda")), "Triton kernels not available"
    result = gpu_fused.gpu_result()
    checks = []
    for dtype in (torch.float32, torch.bfloat16):
        bb = Backbone(dtype, layers=2)
        for rows in (1, 2, 3, 8):
            row = check(bb, rows)
            print(json.dumps(row), flush=True)
            checks.append(row)
        del bb
    result["checks"], result["checks_ok"] = checks, all(c["ok"] for c in checks)
    bb = Backbone(torch.bfloat16, layers=args.layers)
    return gpu_fused.tune_then_time(result, args, lambda: tune(bb, result["copy_bandwidth_bytes_per_s"]),
                                    lambda best: layer_steps(bb, best), "backbone")

if __name__ == "__main__":
    raise SystemExit(main())
