"""The codec decoder's transformer: causal sliding-window attention over frames, with layer scale.

It runs at the frame rate (12.5 Hz): one position per frame. Each frame attends to itself and the
`sliding_window - 1` frames before it, with RoPE on absolute frame positions. Streaming keeps the keys and
values of those previous frames per request (see streaming.py). Names follow the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from breeze_worker.model.codec.config import DecoderConfig
from breeze_worker.model.codec.streaming import AttentionSpec, DecoderStreamState, window_mask

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int, initial: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), initial))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class FrameAttention(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.attention_head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
        state: DecoderStreamState | None,
        layer: int,
    ) -> torch.Tensor:
        batch, frames, _ = x.shape
        q = self.q_proj(x).view(batch, frames, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, frames, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, frames, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if state is not None:
            k = torch.cat([state.keys[layer], k], dim=2)
            v = torch.cat([state.values[layer], v], dim=2)
            slots = state.keys[layer].shape[2]
            state.keys[layer] = k[:, :, k.shape[2] - slots :]
            state.values[layer] = v[:, :, v.shape[2] - slots :]
        groups = self.heads // self.kv_heads
        if groups > 1:  # kv head h serves query heads h * groups .. (h + 1) * groups - 1
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(batch, frames, -1))


class GatedMLP(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.self_attn = FrameAttention(config)
        self.mlp = GatedMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(config.hidden_size, config.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(config.hidden_size, config.layer_scale_initial_scale)

    def forward(self, x, rope, mask, state, layer: int) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), rope, mask, state, layer))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class FrameTransformer(nn.Module):
    """latent [B, T, latent_dim] -> latent [B, T, latent_dim] through `num_hidden_layers` layers."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)

    def attention_specs(self) -> list[AttentionSpec]:
        c = self.config
        spec = AttentionSpec(c.num_key_value_heads, c.attention_head_dim, c.sliding_window - 1)
        return [spec] * c.num_hidden_layers

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dim = self.config.attention_head_dim
        exponent = torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim
        inv_freq = 1.0 / (self.config.rope_theta**exponent)
        angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # [B, T, dim / 2]
        angles = torch.cat((angles, angles), dim=-1).unsqueeze(1)  # [B, 1, T, dim]
        return angles.cos(), angles.sin()

    def forward(self, x: torch.Tensor, state: DecoderStreamState | None = None) -> torch.Tensor:
        x = self.input_proj(x)
        frames = x.shape[1]
        steps = torch.arange(frames, device=x.device)
        window = self.config.sliding_window
        if state is None:
            positions = steps.unsqueeze(0)
            distance = steps.view(-1, 1) - steps.view(1, -1)
            mask = ((distance >= 0) & (distance < window)).view(1, 1, frames, frames)
        else:
            positions = state.position.unsqueeze(1) + steps
            mask = window_mask(state.position, frames, window - 1, window)
        rope = self._rope(positions)
        for index, layer in enumerate(self.layers):
            x = layer(x, rope, mask, state, index)
        return self.output_proj(self.norm(x))
