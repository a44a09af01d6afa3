"""The fast path's layer kernels (engine/fastpath/fused.py) composed as the served forms run them, and the
model's own layers (model/lm) as their reference.

- the depth decoder's layer step (the `fused+chain` kernels: q/k/v + RoPE + cache write, attention, output
  projection + residual, norm + gate/up + SiLU, down projection + residual), position by position as a frame
  runs it: the 2-position prefill at start 0, then one position at a time, over 16 cache slots;
- the backbone's layer step (the `fused+chain+all` kernels around the attention: norm + q/k/v, q/k norm +
  RoPE + a write at each row's own slot, attention, output projection, the MLP), a prompt then single steps,
  each row at its own RoPE position and cache slot;
- a depth position's logits (`depth_head`: final norm, the codebook's head in FP32, CFG over two or three
  rows).

The reference is the model's `DecoderLayer` over all positions at once with a causal mask (no cache), in the
layer's dtype, and again in FP32 on the same (rounded) weights; errors are of what the layers add to their
input (the residual stream would hide most of a layer's error behind the input it carries). On a CUDA device
the kernels run; on the CPU the same functions run their torch stages, which checks this composition itself
(tests/gpu, unmarked tests).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from breeze_worker.engine.fastpath import fused
from breeze_worker.engine.fastpath.layers import PackedLayer, attend_rows
from breeze_worker.model.lm.backbone import qwen3_layer
from breeze_worker.model.lm.depth_decoder import llama_layer
from breeze_worker.model.lm.layers import NoCache, additive_mask
from breeze_worker.model.lm.rope import RotaryEmbedding

DEPTH_SLOTS = 16  # the depth decoder's cache: one slot per codebook position


@dataclass
class Layer:
    """A model layer with seeded random weights, and the same weights packed for the fast path."""

    module: torch.nn.Module
    packed: PackedLayer
    rotary: RotaryEmbedding


def seeded_layers(kind: str, config, count: int, dtype: torch.dtype, device: torch.device, seed: int) -> list[Layer]:
    """`count` depth ("depth": Llama) or backbone ("backbone": Qwen3, q/k norm) layers of `config`'s sizes:
    normal(0, 0.02) weights, norm gains 1 + 0.1 noise, drawn in FP32 on `device` then cast to `dtype`."""
    build = llama_layer if kind == "depth" else qwen3_layer
    scaling = getattr(config, "rope_scaling", None)
    generator = torch.Generator(device=device).manual_seed(seed)
    layers = []
    with torch.no_grad():
        for i in range(count):
            with torch.device(device):
                module = build(config, i)
                rotary = RotaryEmbedding(config.head_dim, config.rope_theta, scaling)
            for name, param in sorted(module.named_parameters()):
                noise = torch.randn(param.shape, generator=generator, device=device)
                param.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.02 * noise)
            module = module.to(dtype).eval().requires_grad_(False)
            layers.append(Layer(module, PackedLayer(module), rotary))
    return layers


def upcast(layer: Layer) -> torch.nn.Module:
    """The same layer in FP32 (its weights as they are, rounded or not): the reference's arithmetic."""
    return copy.deepcopy(layer.module).float()


def eager_layers(modules: list[torch.nn.Module], x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The model's layers over all T positions of x [R, T, H] at once, causal, no cache (cos/sin [T, D] or
    [R, T, D]): the output at every position."""
    t = x.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()[None, None]
    with torch.no_grad():
        for module in modules:
            dtype = next(module.parameters()).dtype
            x = module(x.to(dtype), (cos.to(dtype), sin.to(dtype)), additive_mask(causal, dtype), NoCache())
    return x


def depth_steps(t_total: int) -> list[tuple[int, int]]:
    """(start, positions) of a frame's depth steps: the 2-position prefill, then one position each."""
    return [(0, 2)] + [(p, 1) for p in range(2, t_total)]


def depth_mask(start: int, t: int, device: torch.device) -> torch.Tensor:
    """Additive [1, 1, t, 16] FP32 mask: query start + i sees slots 0..start + i (FrameStep's)."""
    query = torch.arange(start, start + t, device=device)[:, None]
    allowed = torch.arange(DEPTH_SLOTS, device=device)[None, :] <= query
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None].contiguous()


def depth_layer_kernels(layer: PackedLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, start: int,
                        workspace: fused.DownWorkspace,
                        kernels: fused.KernelSettings = fused.DEFAULT_KERNELS) -> torch.Tensor:
    """One depth layer at positions start..start+T-1 of x [R, T, H] as the `fused+chain` form's five kernels;
    cos/sin [T, D] of those positions; the caches [R, kv, 16, D] are written in place."""
    t = x.shape[1]
    q = fused.qkv_rope(x, layer.w_in, layer.eps_in, layer.qkv, cos, sin, k_cache, v_cache, start,
                       heads=layer.heads, kv_heads=layer.kv_heads, head_dim=layer.head_dim, kernels=kernels)
    attn = fused.depth_attention(q, k_cache, v_cache, depth_mask(start, t, x.device), start, scale=layer.scale,
                                 kernels=kernels)
    x = fused.down_residual(attn, layer.attn.o_proj.weight, x, workspace, kernel="o_residual", kernels=kernels)
    hidden = fused.norm_gate_up(x, layer.w_post, layer.eps_post, layer.gate_up, layer.intermediate,
                                kernels=kernels)
    return fused.down_residual(hidden, layer.mlp.down_proj.weight, x, workspace, kernels=kernels)


def run_depth_frame(layers: list[Layer], x: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]],
                    workspace: fused.DownWorkspace,
                    kernels: fused.KernelSettings = fused.DEFAULT_KERNELS) -> torch.Tensor:
    """x [R, T, H] (T <= 16) through the stacked depth layers step by step as a frame runs them; the
    output [R, T, H] of every position. `caches` (one pair per layer) are written in place."""
    t_total = x.shape[1]
    cos, sin = layers[0].rotary(torch.arange(t_total, device=x.device), x.dtype)
    outs = []
    for start, t in depth_steps(t_total):
        h = x[:, start:start + t].contiguous()
        for layer, (k, v) in zip(layers, caches):
            h = depth_layer_kernels(layer.packed, h, cos[start:start + t].contiguous(),
                                    sin[start:start + t].contiguous(), k, v, start, workspace, kernels)
        outs.append(h)
    return torch.cat(outs, dim=1)


def stale_caches(count: int, rows: int, layer: PackedLayer, slots: int, dtype: torch.dtype, device: torch.device,
                 seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Caches [R, kv, slots, D] full of another request's entries: whatever the mask must hide."""
    generator = torch.Generator(device=device).manual_seed(seed)
    shape = (rows, layer.kv_heads, slots, layer.head_dim)
    return [(torch.randn(shape, generator=generator, device=device).to(dtype),
             torch.randn(shape, generator=generator, device=device).to(dtype)) for _ in range(count)]


def check_depth(layers: list[Layer], rows: int, positions: int, seed: int) -> dict:
    """Depth layers run by the kernels vs the model's layers: relative errors of the kernels' and of the
    model's own arithmetic in the layers' dtype against the model in FP32 on the same weights."""
    first = layers[0].packed
    device, dtype = first.qkv.device, first.qkv.dtype
    generator = torch.Generator(device=device).manual_seed(seed)
    hidden_size = first.w_in.shape[0]
    x = torch.randn(rows, positions, hidden_size, generator=generator, device=device).to(dtype)
    caches = stale_caches(len(layers), rows, first, DEPTH_SLOTS, dtype, device, seed + 1)
    with torch.no_grad():
        got = run_depth_frame(layers, x, caches, fused.DownWorkspace())
        cos, sin = layers[0].rotary(torch.arange(positions, device=device), torch.float32)
        same_dtype = eager_layers([layer.module for layer in layers], x, cos, sin)
        reference = eager_layers([upcast(layer) for layer in layers], x.float(), cos, sin)
    return _errors(x, got, same_dtype, reference) | {"rows": rows, "positions": positions, "layers": len(layers)}


def backbone_layer_kernels(layer: PackedLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
                           workspace: fused.DownWorkspace) -> torch.Tensor:
    """One backbone layer of x [R, T, H] as the `fused+chain+all` form runs it: cos/sin [R, 1, T, D], `slots`
    [R, T] (each row its own), additive `mask` [R, 1, T, L] over the caches [R, kv, L, D]."""
    proj = fused.norm_linear(x, layer.w_in, layer.eps_in, layer.qkv)
    q = fused.qk_norm_rope(proj, layer.qk_norm, layer.qk_eps, cos, sin, k_cache, v_cache, slots, heads=layer.heads,
                           kv_heads=layer.kv_heads, head_dim=layer.head_dim)
    out = attend_rows(q, k_cache, v_cache, mask, layer.scale, reduce=True)
    x = fused.down_residual(out, layer.attn.o_proj.weight, x, workspace, kernel="o_residual")
    hidden = fused.norm_gate_up(x, layer.w_post, layer.eps_post, layer.gate_up, layer.intermediate)
    return fused.down_residual(hidden, layer.mlp.down_proj.weight, x, workspace)


def check_backbone(layers: list[Layer], rows: int, prompt: int, steps: int, slots: int, seed: int) -> dict:
    """Backbone layers by the kernels (a `prompt`-position prefill, then `steps` single positions; row r at
    RoPE positions 3r.. and cache slots from 2r) vs the model's layers, as `check_depth`."""
    first = layers[0].packed
    device, dtype = first.qkv.device, first.qkv.dtype
    generator = torch.Generator(device=device).manual_seed(seed)
    total = prompt + steps
    if 2 * (rows - 1) + total > slots:
        raise ValueError("the rows' slots do not fit the cache")
    x = torch.randn(rows, total, first.w_in.shape[0], generator=generator, device=device).to(dtype)
    positions = 3 * torch.arange(rows, device=device)[:, None] + torch.arange(total, device=device)[None]
    first_slot = 2 * torch.arange(rows, device=device)[:, None]
    caches = stale_caches(len(layers), rows, first, slots, dtype, device, seed + 1)
    workspace = fused.DownWorkspace()
    cos, sin = layers[0].rotary(positions, dtype)  # [R, T, D]
    outs = []
    with torch.no_grad():
        for start, t in [(0, prompt)] + [(prompt + i, 1) for i in range(steps)]:
            step_slots = first_slot + torch.arange(start, start + t, device=device)[None]
            written = torch.arange(slots, device=device)[None, None, :]  # [1, 1, L]
            query_slot = step_slots[:, :, None]  # [R, t, 1]
            allowed = (written >= first_slot[:, :, None]) & (written <= query_slot)
            mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[:, None].contiguous()  # [R, 1, t, L]
            h = x[:, start:start + t].contiguous()
            for layer, (k, v) in zip(layers, caches):
                h = backbone_layer_kernels(layer.packed, h, cos[:, None, start:start + t].contiguous(),
                                           sin[:, None, start:start + t].contiguous(), k, v, step_slots.contiguous(),
                                           mask, workspace)
            outs.append(h)
        got = torch.cat(outs, dim=1)
        cos32, sin32 = layers[0].rotary(positions, torch.float32)
        same_dtype = eager_layers([layer.module for layer in layers], x, cos32, sin32)
        reference = eager_layers([upcast(layer) for layer in layers], x.float(), cos32, sin32)
    return _errors(x, got, same_dtype, reference) | {"rows": rows, "prompt": prompt, "steps": steps,
                                                  "layers": len(layers)}


def check_depth_head(hidden: int, vocab: int, dtype: torch.dtype, device: torch.device, seed: int) -> dict:
    """`depth_head` (final norm, FP32 head, CFG) on 4 streams over 8 rows (two CFG pairs, one plain stream, one
    with two guidance scales over three rows; the rows a strided view, as the step hands them) vs float64
    arithmetic on the same rounded values."""
    generator = torch.Generator(device=device).manual_seed(seed)
    x_all = torch.randn(8, 2, hidden, generator=generator, device=device).to(dtype)
    x = x_all[:, -1]  # [R, H], row stride 2 * hidden
    w_norm = (1.0 + 0.1 * torch.randn(hidden, generator=generator, device=device)).to(dtype)
    head = (0.05 * torch.randn(hidden, vocab, generator=generator, device=device)).to(dtype).contiguous()
    cond = torch.tensor([0, 2, 4, 5], device=device)
    uncond = torch.tensor([1, 3, 4, 7], device=device)
    scale = torch.tensor([2.0, 1.5, 1.0, 2.5], device=device)
    ref = torch.tensor([1, 3, 4, 6], device=device)  # the third row of stream 3; the others have none
    ref_scale = torch.tensor([0.0, 0.0, 0.0, 1.25], device=device)
    eps = 1e-5
    with torch.no_grad():
        got = fused.depth_head(x, w_norm, eps, head, cond, uncond, scale, ref_row=ref, ref_scale=ref_scale)
        xd = x.double()
        normed = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)).float() * w_norm.float()
        logits = normed.to(dtype).double() @ head.double()  # the product's input rounded as the kernel rounds it
        want = (logits[uncond] + ref_scale.double()[:, None] * (logits[ref] - logits[uncond])
                + scale.double()[:, None] * (logits[cond] - logits[uncond]))
    return {"error": relative_error(got, want), "finite": bool(torch.isfinite(got).all()),
            "shape_ok": tuple(got.shape) == (4, vocab) and got.dtype == torch.float32}


def relative_error(test: torch.Tensor, ref: torch.Tensor) -> float:
    test, ref = test.double(), ref.double()
    return float((test - ref).norm() / ref.norm().clamp(min=1e-300))


def _errors(x: torch.Tensor, got: torch.Tensor, same_dtype: torch.Tensor, reference: torch.Tensor) -> dict:
    """Errors of what the layers add to their input (output - x): the residual stream would otherwise hide
    most of a layer's own error behind the input it carries through."""
    x = x.double()
    added = reference.double() - x
    return {"kernels_error": relative_error(got.double() - x, added),
            "model_error": relative_error(same_dtype.double() - x, added),
            "kernels_vs_model": relative_error(got, same_dtype), "finite": bool(torch.isfinite(got).all()),
            "dtype": str(got.dtype).replace("torch.", "")}
