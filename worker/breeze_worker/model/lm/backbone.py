"""The Qwen3 backbone: causal decoder layers with per-head q/k RMSNorm, plain RoPE and a final RMSNorm.

It reads input embeddings (projected text-encoder states, summed audio-frame embeddings) and returns
normalized hidden states; `BreezeLM` owns the audio embedding and the lm_head. Positions and the mask
come from the caller (left padding: positions count valid tokens only), the KV cache too (see layers.py).
"""

from __future__ import annotations

import torch
from torch import nn

from breeze_worker.model.lm.config import BackboneConfig
from breeze_worker.model.lm.layers import Attention, DecoderLayer, GatedMLP, RMSNorm
from breeze_worker.model.lm.rope import RotaryEmbedding


def qwen3_layer(config: BackboneConfig, layer_idx: int) -> DecoderLayer:
    c = config
    attention = Attention(
        layer_idx, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
        scale=c.head_dim**-0.5, bias=c.attention_bias, qk_norm_eps=c.rms_norm_eps,
    )
    return DecoderLayer(attention, GatedMLP(c.hidden_size, c.intermediate_size, c.hidden_act), c.hidden_size,
                        c.rms_norm_eps)


class Backbone(nn.Module):
    """Checkpoint prefix `backbone_model.`: `layers.L.*` and `norm.weight`."""

    def __init__(self, config: BackboneConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(qwen3_layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache,
    ) -> torch.Tensor:
        """inputs_embeds [R, T, H], positions int64 [R, T], additive mask [R, 1, T, T_all] -> hidden [R, T, H]."""
        x = inputs_embeds
        rope = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, rope, attention_mask, cache)
        return self.norm(x)
