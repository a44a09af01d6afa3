"""Our implementation of the Qwen3-TTS-Tokenizer-12Hz decoder: 16 codes per frame -> 1920 samples at 24 kHz.

Pipeline (all causal, so streaming equals one-shot decoding):
  RVQ dequantize (codebook 0 and codebooks 1..15 in two groups, each projected to `codebook_dim`)
  -> causal conv (3) to `latent_dim`
  -> frame transformer (sliding window, layer scale; transformer.py)
  -> `upsampling_ratios` x (transposed conv + ConvNeXt block)               (x4: 50 Hz)
  -> causal conv (7) to `decoder_dim` -> `upsample_rates` x UpsampleBlock    (x480: 24 kHz)
  -> SnakeBeta -> causal conv (7) to one channel -> clamp to [-1, 1].
Module and parameter names mirror the checkpoint's `decoder.*` tensor names, so its state dict loads as is.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from breeze_worker.model.codec.config import DecoderConfig
from breeze_worker.model.codec.layers import (
    CausalConv1d,
    CausalTransposedConv1d,
    ConvNeXtBlock,
    SnakeBeta,
    UpsampleBlock,
)
from breeze_worker.model.codec.streaming import ContextSpec, DecoderStreamState
from breeze_worker.model.codec.transformer import FrameTransformer


class Codebook(nn.Module):
    """Entries stored as running sums and usage counts; an entry is `embedding_sum / usage`."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def entries(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5).unsqueeze(1)


class _CodebookSlot(nn.Module):
    _codebook: Codebook

    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _CodebookList(nn.Module):
    def __init__(self, count: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(_CodebookSlot(size, dim) for _ in range(count))


class ResidualCodebookGroup(nn.Module):
    """A group of residual codebooks: the sum of their entries, projected by a 1x1 conv.

    `input_proj` is only used when encoding; it is kept so the checkpoint loads (and writes) whole.
    """

    def __init__(self, count: int, size: int, dim: int, out_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(out_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)
        self.vq = _CodebookList(count, size, dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, count, T] -> [B, out_dim, T]."""
        total: torch.Tensor | None = None
        for index, slot in enumerate(self.vq.layers):
            codebook = cast(_CodebookSlot, slot)._codebook  # ModuleList items are typed as Module
            part = nn.functional.embedding(codes[:, index], codebook.entries())
            total = part if total is None else total + part
        assert total is not None  # a group has at least one codebook
        return self.output_proj(total.transpose(1, 2))


class SplitResidualDequantizer(nn.Module):
    """Codebook 0 (semantic) and codebooks 1.. (acoustic) have separate groups; their outputs add up."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        width = config.required_codebook_dim
        dim = width // 2
        size = config.codebook_size
        self.rvq_first = ResidualCodebookGroup(1, size, dim, width)
        self.rvq_rest = ResidualCodebookGroup(config.num_quantizers - 1, size, dim, width)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class CodecDecoder(nn.Module):
    """codes [B, 16, T] (int64) -> waveform [B, T * samples_per_frame] (float32, in [-1, 1])."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        latent = config.latent_dim
        self.quantizer = SplitResidualDequantizer(config)
        self.pre_conv = CausalConv1d(config.required_codebook_dim, latent, kernel_size=3)
        self.pre_transformer = FrameTransformer(config)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransposedConv1d(latent, latent, ratio, ratio), ConvNeXtBlock(latent)])
            for ratio in config.upsampling_ratios
        )
        stages: list[nn.Module] = [CausalConv1d(latent, config.decoder_dim, kernel_size=7)]
        for index, rate in enumerate(config.upsample_rates):
            in_dim, out_dim = config.decoder_dim >> index, config.decoder_dim >> (index + 1)
            stages.append(UpsampleBlock(in_dim, out_dim, rate))
        out_dim = config.decoder_dim >> len(config.upsample_rates)
        stages += [SnakeBeta(out_dim), CausalConv1d(out_dim, 1, kernel_size=7)]
        self.decoder = nn.ModuleList(stages)
        self._context_specs = self._number_stream_slots()

    def _number_stream_slots(self) -> list[ContextSpec]:
        specs: list[ContextSpec] = []
        for module in self.modules():
            if isinstance(module, (CausalConv1d, CausalTransposedConv1d)) and module.context_steps > 0:
                module.stream_slot = len(specs)
                specs.append(ContextSpec(module.in_channels, module.context_steps))
        return specs

    @property
    def samples_per_frame(self) -> int:
        return self.config.samples_per_frame

    @property
    def device(self) -> torch.device:
        return self.pre_conv.conv.weight.device

    def forward(self, codes: torch.Tensor, state: DecoderStreamState | None = None) -> torch.Tensor:
        if codes.dim() != 3 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(
                f"codes must be [batch, {self.config.num_quantizers}, frames], got {tuple(codes.shape)}"
            )
        hidden = self.quantizer.decode(codes.long())
        hidden = self.pre_conv(hidden, state)
        hidden = self.pre_transformer(hidden.transpose(1, 2), state).transpose(1, 2)
        for pair in self.upsample:
            transposed, convnext = cast(nn.ModuleList, pair)  # ModuleList items are typed as Module
            hidden = convnext(transposed(hidden, state), state)
        for stage in self.decoder:
            hidden = stage(hidden, state)
        if state is not None:
            state.advance(codes.shape[-1])
        return hidden.clamp(min=-1.0, max=1.0).squeeze(1)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """One-shot decode of whole sequences (every row starts from silence)."""
        return self.forward(codes.to(self.device))

    def new_stream(self, batch: int = 1) -> DecoderStreamState:
        """Fresh streaming state for `batch` requests, on the decoder's device."""
        return DecoderStreamState.zeros(
            batch, self._context_specs, self.pre_transformer.attention_specs(), device=self.device
        )

    @torch.no_grad()
    def decode_stream(self, codes: torch.Tensor, state: DecoderStreamState) -> torch.Tensor:
        """Decode the next `n` frames of each row: codes [B, 16, n] -> float32 [B, n * 1920].

        Updates `state` in place; row b of `codes` continues row b of `state`.
        """
        if codes.shape[0] != state.batch_size:
            raise ValueError(f"codes have {codes.shape[0]} rows but the stream state has {state.batch_size}")
        return self.forward(codes.to(self.device), state)
