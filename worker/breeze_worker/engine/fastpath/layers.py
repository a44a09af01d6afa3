"""Lean decoder-layer forwards for the fast path, over the model's own weights.

The model's blocks (`breeze_worker.model.lm.layers.DecoderLayer`) are the numerical reference; they launch
~45-60 small kernels per layer. `PackedLayer` computes the same function with fewer launches: one GEMM for
q/k/v and one for gate/up (the module weights are re-pointed at views of the packed tensors, so no memory is
duplicated), q/k RMSNorm and RoPE applied to q and k together, grouped-query attention without repeating
the cache, and FP32 softmax. Layer inputs and outputs keep the residual stream's dtype; each GEMM runs in its
weight's dtype (FP16 under `fp16-mixed`, see engine/precision.py).

`decode_layer` is the same layer as one pure function of tensors (weights, cache, slot indices, mask)
and constants, with the cache write inside: the uncompiled step's backbone layer.

The compiled step runs a layer as the units of `LayerUnits` (one compilation per shape, shared by every
layer of a kind), cut where a tensor must reach memory anyway (see the units' comment below). Their
projections are library GEMMs, or with `small_rows` FP32 multiply-and-sum reductions over the input axis
(`small_rows_linear`, attention as `reduce_attention`): at a few rows every projection is GEMV-shaped, and
Inductor turns each reduction into one bandwidth-bound kernel with the norm or activation in front and the
residual add behind it fused in, where a GEMM library call reads the weight below bandwidth and fuses with
nothing. The reductions accumulate in FP32 as the GEMMs do; they only pay off compiled (eager they
materialize FP32 copies of the weights). Which layer runs how is the step's layer form (fastpath/forms.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from breeze_worker.model.lm.layers import DecoderLayer


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """A GEMM in the weight's dtype, returning the input's dtype (no casts when they agree)."""
    if x.dtype == weight.dtype:
        return F.linear(x, weight, bias)
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)


def small_rows_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] with few rows times weight [N, K] transposed, as a multiply-and-sum over K in FP32.

    The input is rounded to the weight's dtype first, as the GEMM sees it. One reduction per input row over
    the same weight: Inductor fuses them into one kernel that reads the weight once."""
    lead, k = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, k).to(weight.dtype).float()
    w = weight.float()
    y = torch.stack([(flat[i] * w).sum(-1) for i in range(flat.shape[0])])
    return y.reshape(*lead, weight.shape[0]).to(x.dtype)


def reduce_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | float,
                     scale: float) -> torch.Tensor:
    """Grouped attention as reductions: q [R, kv, G, T, D], keys/values [R, kv, L, D], additive `mask`
    broadcastable to [R, 1, 1, T, L] (0.0: none) -> [R, kv, G, T, D] in FP32 (softmax in FP32 as everywhere)."""
    scores = (q.float()[..., None, :] * keys.float()[:, :, None, None]).sum(-1) * scale  # [R, kv, G, T, L]
    probs = torch.softmax(scores + mask, dim=-1).to(values.dtype).float()
    return (probs[..., None] * values.float()[:, :, None, None]).sum(-2)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float,
           reduce: bool = False) -> torch.Tensor:
    """Grouped-query attention without repeating the cache: q [R, h, T, D] over keys/values [R, kv, L, D]
    (query head i reads kv head i // (h / kv)), additive `mask` broadcastable to [R, 1, T, L] or None;
    FP32 softmax. -> [R, h, T, D] in the queries' dtype. `reduce`: as reductions (`reduce_attention`, FP32
    from whatever the cache stores), else two batched matmuls; those run in the cache's dtype, so over FP16
    keys beside FP32 queries (fp16-mixed's half-precision backbone cache) the query is scaled first and
    rounded to FP16, the scores bounded by its q/k norms (precision.half_kv_refusal)."""
    rows, h, t, d = q.shape
    kv, length = keys.shape[1], keys.shape[2]
    if reduce:
        out = reduce_attention(q.reshape(rows, kv, h // kv, t, d), keys, values,
                               0.0 if mask is None else mask[:, :, None], scale)
        return out.to(values.dtype).to(q.dtype).reshape(rows, h, t, d)
    grouped = q.reshape(rows, kv, (h // kv) * t, d)
    if keys.dtype == q.dtype:
        scores = torch.matmul(grouped, keys.transpose(2, 3)).float() * scale
    else:
        scores = torch.matmul((grouped * scale).to(keys.dtype), keys.transpose(2, 3)).float()
    if mask is not None:
        scores = (scores.view(rows, kv, h // kv, t, length) + mask[:, :, None]).view(rows, kv, -1, length)
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(probs, values).view(rows, h, t, d).to(q.dtype)


def attend_rows(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float,
                reduce: bool = False) -> torch.Tensor:
    """`attend`, with the heads laid side by side per position: q [R, h, T, D] -> [R, T, h * D]."""
    rows, h, t, d = q.shape
    return attend(q, keys, values, mask, scale, reduce=reduce).transpose(1, 2).reshape(rows, t, h * d)


def write_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> None:
    """Keys/values [R, kv, T, D] into the caches [R, kv, L, D] at `slots` int64 [R or 1, T], in place."""
    rows, kv, t, d = k.shape
    index = slots.expand(rows, t)[:, None, :, None].expand(rows, kv, t, d)
    k_cache.scatter_(2, index, k.to(k_cache.dtype))
    v_cache.scatter_(2, index, v.to(v_cache.dtype))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Same function as the model's RMSNorm (no unit offset): w * (x_hat in float32, cast to x's dtype).

    On CUDA, `F.rms_norm` (one fused kernel instead of seven; it applies the weight before the final
    cast, a rounding difference only); on the CPU the model's exact formula (the tests' FP32 reference)."""
    if x.is_cuda and weight.dtype == x.dtype:
        if weight.dim() == 1:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        return F.rms_norm(x, (x.shape[-1],), None, eps) * weight  # per-head gains (q/k norm together)
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def _pack(modules: list[nn.Linear]) -> torch.Tensor | None:
    """Concatenate the weights of linears along the output axis and re-point each module's weight at its
    slice of the packed tensor (no extra memory). None when dtypes/devices differ or biases exist."""
    weights = [m.weight for m in modules]
    if any(m.bias is not None for m in modules) or len({(w.dtype, w.device) for w in weights}) != 1:
        return None
    packed = torch.cat([w.detach() for w in weights], dim=0)
    start = 0
    for m in modules:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(packed[start:start + n], requires_grad=False)
        start += n
    return packed


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [R, heads, T, D], cos/sin [R, 1, T, D]: x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def decode_layer(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slots: torch.Tensor, mask: torch.Tensor, w_in: torch.Tensor, qkv: torch.Tensor,
                 qk_norm: torch.Tensor | None, o_proj: torch.Tensor, w_post: torch.Tensor, gate_up: torch.Tensor,
                 down: torch.Tensor, *, heads: int, kv_heads: int, head_dim: int, scale: float, eps_in: float,
                 eps_post: float, qk_eps: float, intermediate: int, act) -> torch.Tensor:
    """One packed decoder layer over a static cache, as a pure function (the uncompiled backbone layer).

    x [R, T, hidden]; cos/sin [R or 1, 1, T, D]; k_cache/v_cache [R, kv, L, D] (views into the static
    cache; this call writes its keys/values at `slots` int64 [R or 1, T] and attends over all L slots);
    `mask` additive float32, broadcastable to [R, 1, T, L] (it must block every slot not yet written)."""
    rows, t, _ = x.shape
    h, kv, d = heads, kv_heads, head_dim
    qkv_out = linear(rms_norm(x, w_in, eps_in), qkv).view(rows, t, h + 2 * kv, d).transpose(1, 2)
    qk, v = qkv_out[:, :h + kv], qkv_out[:, h + kv:]
    if qk_norm is not None:
        qk = rms_norm(qk, qk_norm, qk_eps)
    qk = rotate(qk, cos, sin)
    write_cache(k_cache, v_cache, slots, qk[:, h:], v)
    out = attend_rows(qk[:, :h], k_cache, v_cache, mask, scale)
    x = x + linear(out, o_proj)
    gu = linear(rms_norm(x, w_post, eps_post), gate_up)
    return x + linear(act(gu[..., :intermediate]) * gu[..., intermediate:], down)


# ---- a layer as units ----
# Unit boundaries are where Inductor must write a tensor to memory. Inside one compiled function it inlines
# a pointwise producer into every consumer, so a projection's input would be recomputed per output block:
# for the down projection that is SiLU(gate) * up, one exp per weight element. Cut after the activation and
# after the q/k/v projection (the cache write between them is a single in-place scatter per tensor), each
# projection reads a ready input. `small_rows`: projections and attention as FP32 reductions
# (`small_rows_linear`, `reduce_attention`), else library GEMMs and matmul attention.

def _unit_linear(x: torch.Tensor, weight: torch.Tensor, small_rows: bool) -> torch.Tensor:
    return small_rows_linear(x, weight) if small_rows else linear(x, weight)


def layer_qkv(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, w_in: torch.Tensor, qkv: torch.Tensor,
              qk_norm: torch.Tensor | None, k_out: torch.Tensor | None, v_out: torch.Tensor | None, *, heads: int,
              kv_heads: int, head_dim: int, eps_in: float, qk_eps: float,
              small_rows: bool) -> tuple[torch.Tensor, ...]:
    """Input norm, q/k/v projection, q/k norm and RoPE: q [R, h, T, D], k and v [R, kv, T, D]. With
    `k_out`/`v_out` (cache slots known when the step is built: the depth decoder's) k and v are written
    there and only q is returned."""
    rows, t, _ = x.shape
    h, kv, d = heads, kv_heads, head_dim
    out = _unit_linear(rms_norm(x, w_in, eps_in), qkv, small_rows).view(rows, t, h + 2 * kv, d).transpose(1, 2)
    qk, v = out[:, :h + kv], out[:, h + kv:]
    if qk_norm is not None:
        qk = rms_norm(qk, qk_norm, qk_eps)
    qk = rotate(qk, cos, sin)
    if k_out is not None and v_out is not None:
        k_out.copy_(qk[:, h:])
        v_out.copy_(v)
        return (qk[:, :h],)
    return qk[:, :h], qk[:, h:], v


def layer_norm_qkv(x: torch.Tensor, w_in: torch.Tensor, qkv: torch.Tensor, *, eps_in: float) -> torch.Tensor:
    """Input norm and the packed q/k/v projection (the GEMM library): [R, T, (h + 2 kv) * D], for
    fastpath/fused.py's qk_norm_rope kernel to take from there."""
    return linear(rms_norm(x, w_in, eps_in), qkv)


def layer_mlp_out_addmm(hidden: torch.Tensor, x: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """`layer_mlp_out` as one library call: x + hidden @ down^T with the residual added in the GEMM's epilogue
    (no separate add kernel; the projection is not rounded to x's dtype before the add), written over x: the
    caller's tensor, read by nothing after (an out-of-place addmm would first copy x, one more kernel a
    layer step). Called as it is, not compiled (compiling an input mutation brings the copy back). Under
    fp16-mixed (FP32 residual, FP16 weights) the GEMM's output is rounded to the residual's dtype and added,
    as `layer_mlp_out` does."""
    if x.dtype != down.dtype:
        return x + linear(hidden, down)
    rows, t, width = x.shape
    out = x.reshape(rows * t, width)
    out.addmm_(hidden.reshape(rows * t, -1).to(down.dtype), down.t())
    return out.view(rows, t, width)


def layer_attention_mlp_in(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
                           x: torch.Tensor, o_proj: torch.Tensor, w_post: torch.Tensor, gate_up: torch.Tensor, *,
                           scale: float, eps_post: float, intermediate: int, act,
                           small_rows: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the (already written) cache, output projection and residual, post norm, gate and up
    projections and the activation: (x after attention [R, T, H], act(gate) * up [R, T, I])."""
    return layer_out_mlp_in(attend_rows(q, k_cache, v_cache, mask, scale, reduce=small_rows), x, o_proj, w_post,
                            gate_up, eps_post=eps_post, intermediate=intermediate, act=act, small_rows=small_rows)


def layer_out_mlp_in(out: torch.Tensor, x: torch.Tensor, o_proj: torch.Tensor, w_post: torch.Tensor,
                     gate_up: torch.Tensor, *, eps_post: float, intermediate: int, act,
                     small_rows: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """From the attention output [R, T, h * D]: output projection and residual, post norm, gate and up
    projections and the activation: (x after attention, act(gate) * up)."""
    x = x + _unit_linear(out, o_proj, small_rows)
    normed = rms_norm(x, w_post, eps_post)
    if small_rows:
        gate = small_rows_linear(normed, gate_up[:intermediate])
        up = small_rows_linear(normed, gate_up[intermediate:])
    else:  # one pass over the packed gate/up weight
        gu = linear(normed, gate_up)
        gate, up = gu[..., :intermediate], gu[..., intermediate:]
    return x, act(gate) * up


def layer_mlp_out(hidden: torch.Tensor, x: torch.Tensor, down: torch.Tensor, *, small_rows: bool) -> torch.Tensor:
    """Down projection and residual."""
    return x + _unit_linear(hidden, down, small_rows)


@dataclass(frozen=True)
class LayerUnits:
    """The units a step's layers run through, each compiled or as it is (`wrap`): the three units of a whole
    layer (`qkv`, `attention_mlp_in`, `mlp_out`), the attention alone between fused kernels (`attend`),
    the layer after a kernel's attention (`out_mlp_in`), and the GEMM units around fused.qk_norm_rope
    (`norm_qkv`; `mlp_out_in_place` is never compiled, see `layer_mlp_out_addmm`)."""

    qkv: Callable
    attention_mlp_in: Callable
    mlp_out: Callable
    attend: Callable
    out_mlp_in: Callable
    norm_qkv: Callable
    mlp_out_in_place: Callable

    @classmethod
    def wrapped(cls, wrap: Callable[[Callable], Callable]) -> LayerUnits:
        return cls(qkv=wrap(layer_qkv), attention_mlp_in=wrap(layer_attention_mlp_in), mlp_out=wrap(layer_mlp_out),
                   attend=wrap(attend_rows), out_mlp_in=wrap(layer_out_mlp_in), norm_qkv=wrap(layer_norm_qkv),
                   mlp_out_in_place=layer_mlp_out_addmm)


PLAIN_UNITS = LayerUnits.wrapped(lambda fn: fn)


class PackedLayer:
    """One pre-norm decoder layer (Qwen3 with q/k-norm, or Llama) packed for decoding with a static cache."""

    def __init__(self, layer: DecoderLayer):
        attn, mlp = layer.self_attn, layer.mlp
        self.heads, self.kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.scale = float(attn.scale)
        self.eps_in, self.eps_post = layer.input_layernorm.eps, layer.post_attention_layernorm.eps
        self.w_in, self.w_post = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.attn, self.mlp = attn, mlp
        self.qkv = _pack([attn.q_proj, attn.k_proj, attn.v_proj])
        self.gate_up = _pack([mlp.gate_proj, mlp.up_proj])
        self.act = mlp.act
        self.qk_norm: torch.Tensor | None = None
        self.qk_eps = 0.0
        q_norm, k_norm = attn.q_norm, attn.k_norm
        if q_norm is not None:
            assert k_norm is not None  # Attention has both q/k norms or neither
            h, kv, d = self.heads, self.kv_heads, self.head_dim
            self.qk_eps = q_norm.eps
            # per-head weights of q_norm and k_norm side by side: one normalization for q and k together
            self.qk_norm = torch.cat([q_norm.weight.detach().expand(h, d),
                                      k_norm.weight.detach().expand(kv, d)], dim=0)[None, :, None, :]
        self.intermediate = mlp.down_proj.in_features

    @property
    def decodable(self) -> bool:
        """True when `decode` applies: q/k/v and gate/up packed, no biases."""
        return (self.qkv is not None and self.gate_up is not None and self.attn.o_proj.bias is None
                and self.mlp.down_proj.bias is None)

    def decode(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`decode_layer` over this layer's weights (only when `decodable`)."""
        assert self.qkv is not None and self.gate_up is not None, "decode needs packed q/k/v and gate/up"
        return decode_layer(x, cos, sin, k_cache, v_cache, slots, mask, self.w_in, self.qkv, self.qk_norm,
                            self.attn.o_proj.weight, self.w_post, self.gate_up, self.mlp.down_proj.weight,
                            heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim, scale=self.scale,
                            eps_in=self.eps_in, eps_post=self.eps_post, qk_eps=self.qk_eps,
                            intermediate=self.intermediate, act=self.act)

    def decode_units(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor, units: LayerUnits,
                     small_rows: bool, static_slot: int | None = None) -> torch.Tensor:
        """The same layer as `decode`, through the three units of `units` (compiled or not); `small_rows`:
        projections and attention as FP32 reductions, else library GEMMs. The cache write: inside the first
        unit when the slots are the same for every row and known now (`static_slot`, the depth decoder), else
        an in-place scatter between the units (the backbone: each row writes at its own position)."""
        t = x.shape[1]
        k_out = v_out = None
        if static_slot is not None:
            k_out, v_out = k_cache[:, :, static_slot:static_slot + t], v_cache[:, :, static_slot:static_slot + t]
        qkv = units.qkv(x, cos, sin, self.w_in, self.qkv, self.qk_norm, k_out, v_out, heads=self.heads,
                        kv_heads=self.kv_heads, head_dim=self.head_dim, eps_in=self.eps_in, qk_eps=self.qk_eps,
                        small_rows=small_rows)
        q = qkv[0]
        if static_slot is None:
            write_cache(k_cache, v_cache, slots, qkv[1], qkv[2])
        x, hidden = units.attention_mlp_in(q, k_cache, v_cache, mask, x, self.attn.o_proj.weight, self.w_post,
                                           self.gate_up, scale=self.scale, eps_post=self.eps_post,
                                           intermediate=self.intermediate, act=self.act, small_rows=small_rows)
        return units.mlp_out(hidden, x, self.mlp.down_proj.weight, small_rows=small_rows)

    def _qkv(self, h: torch.Tensor) -> torch.Tensor:
        if self.qkv is not None:
            return linear(h, self.qkv)
        a = self.attn
        return torch.cat([a.q_proj(h), a.k_proj(h), a.v_proj(h)], dim=-1)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            m = self.mlp
            return m.down_proj(self.act(m.gate_proj(h)) * m.up_proj(h))
        gu = linear(h, self.gate_up)
        gate, up = gu[..., :self.intermediate], gu[..., self.intermediate:]
        return self.mlp.down_proj(self.act(gate) * up)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, write_kv, read_kv,
                mask: torch.Tensor | None) -> torch.Tensor:
        """x [R, T, hidden]; cos/sin [R, 1, T, D]; `write_kv(k, v)` stores [R, kv, T, D]; `read_kv()` returns
        the cached keys/values [R, kv, L, D] the queries attend to; `mask` additive, [R, 1, T, L] or None."""
        rows, t, _ = x.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        qkv = self._qkv(rms_norm(x, self.w_in, self.eps_in)).view(rows, t, h + 2 * kv, d).transpose(1, 2)
        qk, v = qkv[:, :h + kv], qkv[:, h + kv:]
        if self.qk_norm is not None:
            qk = rms_norm(qk, self.qk_norm, self.qk_eps)
        qk = rotate(qk, cos, sin)
        write_kv(qk[:, h:], v)
        keys, values = read_kv()
        return self.attend_then_mlp(x, qk[:, :h], keys, values, mask)

    def attend_then_mlp(self, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                        mask: torch.Tensor | None) -> torch.Tensor:
        """The rest of `forward` once q [R, h, T, D] and the keys/values it attends to are there: attention,
        output projection and residual, then the MLP and its residual."""
        out = attend_rows(q, keys, values, mask, self.scale)
        x = x + self.attn.o_proj(out)
        return x + self._mlp(rms_norm(x, self.w_post, self.eps_post))
