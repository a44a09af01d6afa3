"""The T5Gemma2 text encoder: bidirectional, Gemma-style sandwich-norm layers.

- Embedding: table lookup times sqrt(hidden) (the scale rounded to the weight dtype first, as the
  reference does); every position holding `eoi_token_index` takes the learned `eoi_embedding` instead.
- Sliding layers see a symmetric window around each query: keys from q-255 to q+256 for a window of 512
  (left (w+1)//2 keys including the query itself, right w//2), and never padding keys.
- Full-attention layers see every non-padding key (no mask at all when nothing is padded).
- Each layer: x + post_norm(attn(pre_norm(x))), x + post_norm(mlp(pre_norm(x))); RMSNorm scales by (1 + w);
  attention scale query_pre_attn_scalar^-0.5; q/k RMSNorm per head before RoPE; per-layer-type RoPE.

Segments are right padded; positions are 0..len-1 in each row.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from breeze_worker.model.lm.config import TextEncoderConfig
from breeze_worker.model.lm.layers import Attention, GatedMLP, NoCache, RMSNorm, additive_mask
from breeze_worker.model.lm.rope import RotaryEmbedding

SLIDING, FULL = "sliding_attention", "full_attention"


class ScaledEmbedding(nn.Module):
    """`weight` [V, H] and `eoi_embedding` [H] (checkpoint names `embed_tokens.weight` / `.eoi_embedding`)."""

    def __init__(self, vocab: int, hidden: int, eoi_token_index: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, hidden))
        self.eoi_embedding = nn.Parameter(torch.zeros(hidden))
        self.eoi_token_index = eoi_token_index
        self.scale = hidden**0.5

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor(self.scale, dtype=self.weight.dtype).item()  # rounded to the weight dtype
        embeds = nn.functional.embedding(input_ids, self.weight) * scale
        is_eoi = (input_ids == self.eoi_token_index)[..., None]
        return torch.where(is_eoi, self.eoi_embedding.to(embeds.dtype), embeds)


class TextEncoderLayer(nn.Module):
    def __init__(self, config: TextEncoderConfig, layer_idx: int):
        super().__init__()
        c = config
        self.layer_type = c.layer_types[layer_idx]
        self.self_attn = Attention(
            layer_idx, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            scale=float(c.query_pre_attn_scalar) ** -0.5, bias=c.attention_bias, qk_norm_eps=c.rms_norm_eps,
            qk_norm_unit_offset=True, softcap=c.attn_logit_softcapping,
        )
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, c.hidden_activation)
        self.pre_self_attn_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, unit_offset=True)
        self.post_self_attn_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, unit_offset=True)
        self.pre_feedforward_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, unit_offset=True)
        self.post_feedforward_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, unit_offset=True)

    def forward(self, x: torch.Tensor, rope, attention_mask: torch.Tensor | None) -> torch.Tensor:
        attn = self.self_attn(self.pre_self_attn_layernorm(x), rope, attention_mask, NoCache())
        x = x + self.post_self_attn_layernorm(attn)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


def sliding_window_allowed(length: int, window: int, device: torch.device | None = None) -> torch.Tensor:
    """bool [T, T]: query q may see key k when 0 <= q-k < (w+1)//2 or 0 < k-q < w//2 + 1."""
    idx = torch.arange(length, device=device)
    dist = idx[:, None] - idx[None, :]
    left, right = (window + 1) // 2, window // 2 + 1
    return ((dist >= 0) & (dist < left)) | ((dist < 0) & (-dist < right))


class TextEncoder(nn.Module):
    def __init__(self, config: TextEncoderConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = ScaledEmbedding(config.vocab_size, config.hidden_size, config.eoi_token_index)
        self.layers = nn.ModuleList(TextEncoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, unit_offset=True)
        self.rotary = nn.ModuleDict({
            kind: RotaryEmbedding(config.head_dim, float(p["rope_theta"]),
                                  p if p.get("rope_type", "default") != "default" else None)
            for kind, p in config.rope_parameters.items()
        })

    def masks(self, attention_mask: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Additive masks per layer type from a [B, T] padding mask (1 = token, 0 = padding)."""
        length = attention_mask.shape[1]
        key_ok = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, T]
        window = sliding_window_allowed(length, self.config.sliding_window, attention_mask.device)
        return {FULL: additive_mask(key_ok, dtype), SLIDING: additive_mask(key_ok & window, dtype)}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [B, T] (right padded), attention_mask [B, T] -> hidden [B, T, H] (padding rows unused)."""
        x = self.embed_tokens(input_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        masks = self.masks(attention_mask, x.dtype)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        ropes = {kind: rotary(positions, x.dtype) for kind, rotary in self.rotary.items()}
        for layer in self.layers:
            kind = cast(TextEncoderLayer, layer).layer_type  # ModuleList items are typed as Module
            x = layer(x, ropes[kind], masks[kind])
        return self.norm(x)
