"""Transformer building blocks shared by the text encoder, backbone and depth decoder, and the KV-cache protocol.

KV-cache protocol (what an attention layer needs from a cache; the fast path plugs in a preallocated one):

    cache.update(layer_idx, key, value) -> (keys, values)

`key` / `value` are this call's new entries, [R, kv_heads, T_new, head_dim], already rotated. The cache
stores them wherever it keeps them and returns every key / value the new queries may attend to,
[R, kv_heads, T_all, head_dim]. The block does nothing else with the cache: the *caller* decides where
entries go (a static cache is told its write positions before the forward) and passes the attention mask
over exactly the T_all keys the cache returns, plus the positions used for RoPE. Blocks hold no Python-side
data-dependent control flow, so one forward can be captured in a CUDA graph.

Masks: `attention_mask` is an additive float mask broadcastable to [R, heads, T_new, T_all] in the compute
dtype (0 = attend, dtype min = blocked); build it from a boolean mask with `additive_mask`. A fully blocked
row stays finite (uniform weights), which is what left-padded rows need.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from breeze_worker.model.lm.rope import apply_rotary


class KVCache:
    """A growing cache for the eager path: `update` appends along the sequence axis."""

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def update(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        old_k, old_v = self.keys[layer_idx], self.values[layer_idx]
        if old_k is not None:
            assert old_v is not None  # keys and values are stored together
            key = torch.cat((old_k, key), dim=2)
            value = torch.cat((old_v, value), dim=2)
        self.keys[layer_idx], self.values[layer_idx] = key, value
        return key, value

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else int(self.keys[0].shape[2])


class RoundingKVCache(KVCache):
    """A growing cache that stores keys and values in `dtype` and returns them in the dtype they came in: what a
    16-bit cache beside an FP32 residual stream holds (the fast path's FP16 backbone cache under fp16-mixed),
    with the attention arithmetic in FP32 around it."""

    def __init__(self, num_layers: int, dtype: torch.dtype):
        super().__init__(num_layers)
        self.dtype = dtype

    def update(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().update(layer_idx, key.to(self.dtype), value.to(self.dtype))
        return keys.to(key.dtype), values.to(value.dtype)


class NoCache:
    """For bidirectional encoders: nothing is stored, the call's own keys are returned."""

    def update(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return key, value


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask (True = attend) -> additive float mask (0 / dtype min)."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, blocked)


class RMSNorm(nn.Module):
    """RMS normalization in float32. `unit_offset` (Gemma): (x_hat * (1 + w)) cast back; otherwise
    (Qwen3 / Llama): w * x_hat.to(input dtype)."""

    def __init__(self, dim: int, eps: float, unit_offset: bool = False):
        super().__init__()
        self.eps, self.unit_offset = eps, unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (normed * (1.0 + self.weight.float())).type_as(x)
        return self.weight * normed.to(x.dtype)


_ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int, activation: str, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.act = _ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Grouped-query attention with optional per-head q/k RMSNorm (before RoPE) and an explicit KV cache."""

    def __init__(
        self,
        layer_idx: int,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        *,
        bias: bool = False,
        qk_norm_eps: float | None = None,
        qk_norm_unit_offset: bool = False,
        softcap: float | None = None,
    ):
        super().__init__()
        self.layer_idx, self.num_heads, self.num_kv_heads, self.head_dim = layer_idx, num_heads, num_kv_heads, head_dim
        self.scale, self.softcap = scale, softcap
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=bias)
        self.q_norm: RMSNorm | None
        self.k_norm: RMSNorm | None
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps, qk_norm_unit_offset)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps, qk_norm_unit_offset)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache,
    ) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:  # both or neither
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q = apply_rotary(q.transpose(1, 2), cos, sin)
        k = apply_rotary(k.transpose(1, 2), cos, sin)
        k, v = cache.update(self.layer_idx, k, v)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        if self.softcap is None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, scale=self.scale)
        else:
            scores = torch.matmul(q, k.transpose(2, 3)) * self.scale
            scores = torch.tanh(scores / self.softcap) * self.softcap
            if attention_mask is not None:
                scores = scores + attention_mask
            out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
        out = out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
        return self.o_proj(out)


class DecoderLayer(nn.Module):
    """Pre-norm block used by the Qwen3 backbone and the Llama depth decoder:
    x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, attention: Attention, mlp: GatedMLP, hidden: int, eps: float):
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, rope, attention_mask: torch.Tensor | None, cache) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attention_mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))
