"""Rotary position embeddings: inverse frequencies (default, linear, llama3 scaling) and their application.

The inverse frequencies are computed in float32 exactly as the reference implementations do, so the
depth decoder's llama3 constants (factor 32, low/high frequency factors 1/512 and 1/128, original
context 16) land every frequency where they land in the official model: reproduced literally, not tuned.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """1 / theta^(2i/d) for i in [0, d/2), float32, on the CPU whatever the default device: under the loader's
    meta device an arange goes through torch's reference implementations, whose first use imports sympy and
    torch's symbolic shapes (~1 s of a start-up); the buffer is recomputed on the model's device anyway."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / head_dim
    return 1.0 / (theta**exponents)


def linear_inv_freq(head_dim: int, theta: float, factor: float) -> torch.Tensor:
    """Linear position interpolation: every frequency divided by `factor`."""
    return default_inv_freq(head_dim, theta) / factor


def llama3_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency scaling: long wavelengths divided by `factor`, short ones kept, the band between
    interpolated smoothly (wavelength bounds from `original_max_position_embeddings`)."""
    inv_freq = default_inv_freq(head_dim, theta)
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(in_band, smoothed, scaled)


def inv_freq_for(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    options = scaling or {}
    kind = options.get("rope_type", options.get("type", "default"))
    if kind == "default":
        return default_inv_freq(head_dim, theta)
    if kind == "linear":
        return linear_inv_freq(head_dim, theta, float(options["factor"]))
    if kind == "llama3":
        return llama3_inv_freq(head_dim, theta, options)
    raise ValueError(f"unsupported RoPE type {kind!r}")


class RotaryEmbedding(nn.Module):
    """cos / sin tables for integer positions. `inv_freq` is a non-persistent float32 buffer, recomputed
    whenever the module moves (a dtype cast never touches it)."""

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None = None):
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.register_buffer("inv_freq", inv_freq_for(head_dim, theta, scaling), persistent=False)

    def reset_inv_freq(self) -> None:
        self.inv_freq = inv_freq_for(self.head_dim, self.theta, self.scaling).to(self.inv_freq.device)

    def _apply(self, fn, recurse=True):
        # module.to(dtype) / to_empty() would cast or blank the table: recompute it in float32 instead
        super()._apply(fn, recurse)
        self.reset_inv_freq()
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions int64 [..., T] -> (cos, sin) [..., T, head_dim] in `dtype` (computed in float32)."""
        freqs = positions[..., None].to(torch.float32) * self.inv_freq.to(torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, D]; cos/sin [B, T, D] or [T, D] (broadcast over heads)."""
    cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    return x * cos + rotate_half(x) * sin
