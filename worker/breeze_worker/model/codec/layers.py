"""Convolutional building blocks of the codec decoder: causal convolutions, SnakeBeta, ConvNeXt, residual units.

Every block takes `(x [B, C, T], state)`: with `state=None` it pads with zeros on the left (one-shot
decode); with a `DecoderStreamState` it uses and updates the left context kept for it (streaming).
Attribute names follow the checkpoint's tensor names (`conv`, `alpha`, `beta`, `dwconv`, `pwconv1`, ...).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from breeze_worker.model.codec.streaming import DecoderStreamState, slide_context


def conv1d_as_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int = 1) -> torch.Tensor:
    """`F.conv1d(x, weight, bias, dilation=dilation)` (stride 1, no padding, one group) as ONE matrix product:
    the k dilated taps of every batch row are stacked into [C_in * k, B * T] and multiplied by the weight
    as [C_out, C_in * k]. Same arithmetic (FP32 sums of the same products, in another order); on a GPU it
    runs as one large GEMM, where cuDNN may pick a slow algorithm for some shapes (an FFT convolution
    took two thirds of a 32-slot codec step on an H200; docs/performance.md)."""
    b, c_in, length = x.shape
    c_out, _, k = weight.shape
    t = length - (k - 1) * dilation
    rows = x.transpose(0, 1)  # [C_in, B, L] (a view)
    taps = torch.stack([rows[..., j * dilation: j * dilation + t] for j in range(k)], dim=1)  # [C_in, k, B, T]
    out = torch.mm(weight.reshape(c_out, c_in * k), taps.reshape(c_in * k, b * t))
    if bias is not None:
        out = out + bias[:, None]
    return out.view(c_out, b, t).transpose(0, 1).contiguous()


class TwoFormConvolution(nn.Module):
    """A convolution (`self.conv`) that can also run as one GEMM (`_as_gemm`). `gemm_shapes`: the input
    shapes (left context included) at which it does, as the keys of a dict; empty by default. On CUDA the
    codec's slot batches measure both forms per shape before capturing their graph and fill it
    (engine/codec_graphs.py `tune_convolutions`).

    A dict, not a set: a compiled step (engine/codec_graphs.py, `compile`) reads it while Dynamo traces,
    and Dynamo guards `shape in dict` on that one key but `shape in set` on the whole set's contents, so
    with a set every bucket tuned later would invalidate the compiled steps of the buckets before it."""

    conv: nn.Conv1d | nn.ConvTranspose1d  # the library's form, set by the subclass

    def __init__(self) -> None:
        super().__init__()
        self.gemm_shapes: dict[tuple[int, ...], bool] = {}

    def set_form(self, shape: tuple[int, ...], gemm: bool) -> None:
        """Run inputs of `shape` as the GEMM (`gemm`) or through the library's convolution."""
        if gemm:
            self.gemm_shapes[tuple(shape)] = True
        else:
            self.gemm_shapes.pop(tuple(shape), None)

    def _as_gemm(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def convolve(self, x: torch.Tensor, gemm: bool | None = None) -> torch.Tensor:
        """The convolution of an input that already holds its left context; `gemm`: force a form (None:
        `gemm_shapes` decides). Weights of another dtype than `x` (FP16 weights in the codec's fp16-mixed
        precision, model/codec/codec.py) take the input in their dtype and give the output back in x's."""
        if gemm is None:
            gemm = tuple(x.shape) in self.gemm_shapes
        dtype = self.conv.weight.dtype
        if dtype != x.dtype:
            return self.convolve(x.to(dtype), gemm).to(x.dtype)
        return self._as_gemm(x) if gemm else self.conv(x)


class CausalConv1d(TwoFormConvolution):
    """Stride-1 convolution that only looks back: `(kernel - 1) * dilation` samples of left context; its
    GEMM form is `conv1d_as_gemm`."""

    conv: nn.Conv1d

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.in_channels = in_channels
        self.context_steps = (kernel_size - 1) * dilation
        self.stream_slot: int | None = None  # index into DecoderStreamState.contexts, set by the decoder

    @property
    def gemm_capable(self) -> bool:
        return self.conv.groups == 1

    def input_shape(self, output: torch.Tensor) -> tuple[int, int, int]:
        """The shape of the convolution's input (left context included) that gave this module `output`."""
        return output.shape[0], self.in_channels, output.shape[-1] + self.context_steps

    def _as_gemm(self, x: torch.Tensor) -> torch.Tensor:
        return conv1d_as_gemm(x, self.conv.weight, self.conv.bias, self.conv.dilation[0])

    def forward(self, x: torch.Tensor, state: DecoderStreamState | None = None) -> torch.Tensor:
        if self.context_steps == 0:
            return self.convolve(x)
        if state is None:
            return self.convolve(F.pad(x, (self.context_steps, 0)))
        slot = self.stream_slot
        assert slot is not None  # numbered by the decoder, as every convolution with context is
        x, state.contexts[slot] = slide_context(state.contexts[slot], x)
        return self.convolve(x)


def conv_transpose1d_as_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                             stride: int) -> torch.Tensor:
    """`F.conv_transpose1d(x, weight, bias, stride=stride)` (no padding, one group, kernel a multiple of the
    stride) as ONE matrix product and an overlap-add: every input step's contribution to the kernel's k
    output samples is [C_out * k, C_in] @ [C_in, B * n]; the k = m * stride samples of step i land at
    output steps i .. i + m - 1 of `stride` samples each."""
    b, c_in, n = x.shape
    _, c_out, k = weight.shape  # ConvTranspose1d keeps [C_in, C_out, k]
    m = k // stride
    cols = torch.mm(weight.reshape(c_in, c_out * k).t(), x.transpose(0, 1).reshape(c_in, b * n))
    cols = cols.view(c_out, m, stride, b, n).permute(1, 0, 3, 4, 2)  # [m, C_out, B, n, stride]
    if m == 1:
        out = cols[0]
    else:
        out = x.new_zeros(c_out, b, n + m - 1, stride)
        for j in range(m):
            out[:, :, j: j + n] += cols[j]
    out = out.reshape(c_out, b, (n + m - 1) * stride)
    if bias is not None:
        out = out + bias[:, None, None]
    return out.transpose(0, 1).contiguous()


class CausalTransposedConv1d(TwoFormConvolution):
    """Transposed convolution (upsampling by `stride`) trimmed on the right so it stays causal.

    Output sample t depends on input steps floor((t - kernel) / stride) + 1 .. floor(t / stride), so a
    stream keeps `ceil(kernel / stride) - 1` input steps whose output overlaps the next call's.
    Its GEMM form is `conv_transpose1d_as_gemm`.
    """

    conv: nn.ConvTranspose1d

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        if kernel_size < stride:
            raise ValueError("a causal transposed convolution needs kernel_size >= stride")
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.in_channels = in_channels
        self.stride = stride
        self.context_steps = math.ceil(kernel_size / stride) - 1
        self.stream_slot: int | None = None

    @property
    def gemm_capable(self) -> bool:
        return self.conv.groups == 1 and self.conv.kernel_size[0] % self.stride == 0

    def input_shape(self, output: torch.Tensor) -> tuple[int, int, int]:
        """The shape of the convolution's input (context included) that gave this module `output`."""
        return output.shape[0], self.in_channels, output.shape[-1] // self.stride + self.context_steps

    def _as_gemm(self, x: torch.Tensor) -> torch.Tensor:
        return conv_transpose1d_as_gemm(x, self.conv.weight, self.conv.bias, self.stride)

    def forward(self, x: torch.Tensor, state: DecoderStreamState | None = None) -> torch.Tensor:
        steps = x.shape[-1]
        if state is None or self.context_steps == 0:
            return self.convolve(x)[..., : steps * self.stride]
        slot = self.stream_slot
        assert slot is not None  # numbered by the decoder, as every convolution with context is
        x, state.contexts[slot] = slide_context(state.contexts[slot], x)
        start = self.context_steps * self.stride
        return self.convolve(x)[..., start : start + steps * self.stride]


class SnakeBeta(nn.Module):
    """x + sin(a x)^2 / b per channel, with a = exp(alpha), b = exp(beta) (log-scale parameters).

    The `exp` overflows in half precision: it runs in FP32 in every codec precision.
    """

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, state: DecoderStreamState | None = None) -> torch.Tensor:
        frequency = torch.exp(self.alpha).view(1, -1, 1)
        magnitude = torch.exp(self.beta).view(1, -1, 1)
        return x + torch.sin(x * frequency).pow(2) / (magnitude + 1e-9)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv (7) -> LayerNorm -> 4x MLP (GELU) -> per-channel gain, added to the input."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, state: DecoderStreamState | None = None) -> torch.Tensor:
        h = self.dwconv(x, state).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    """SnakeBeta -> dilated causal conv (7) -> SnakeBeta -> 1x1 conv, added to the input."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, kernel_size=7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, kernel_size=1)

    def forward(self, x: torch.Tensor, state: DecoderStreamState | None = None) -> torch.Tensor:
        h = self.conv1(self.act1(x), state)
        return x + self.conv2(self.act2(h), state)


class UpsampleBlock(nn.Module):
    """SnakeBeta -> transposed conv (x rate, halving channels) -> residual units with dilations 1, 3, 9."""

    def __init__(self, in_dim: int, out_dim: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList(
            [
                SnakeBeta(in_dim),
                CausalTransposedConv1d(in_dim, out_dim, kernel_size=2 * rate, stride=rate),
                *(ResidualUnit(out_dim, dilation) for dilation in (1, 3, 9)),
            ]
        )

    def forward(self, x: torch.Tensor, state: DecoderStreamState | None = None) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, state)
        return x
