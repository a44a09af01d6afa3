"""Band-limited resampling between any two sample rates (windowed sinc), in torch on the CPU.

Output sample n sits at input time t = n * rate_in / rate_out and is a weighted sum of the input samples
within `half_width` of t, the weights a Hann-windowed sinc low-pass at `rolloff` times the lower Nyquist
frequency (so downsampling does not alias). When the rates reduce to a small ratio L/M (every common
rate against 24 kHz does), the weights repeat with period L and the filter runs as one strided
convolution with L output phases; otherwise the weights are computed per output block.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

ZERO_CROSSINGS = 16  # sinc lobes on each side of the centre tap
ROLLOFF = 0.945  # cutoff as a fraction of the lower Nyquist frequency
_MAX_PHASES = 1024  # above this many polyphase filters, compute the weights per block instead
_BLOCK = 8192  # output samples per block on the per-block path


def _weights(offsets: torch.Tensor, cutoff: float, half_width: int) -> torch.Tensor:
    """Filter taps for `offsets` (input-sample distance from the output instant), cutoff in cycles/sample."""
    t = offsets.to(torch.float64)
    window = torch.where(t.abs() <= half_width, torch.cos(math.pi * t / (2 * half_width)) ** 2, 0.0)
    return (2 * cutoff * torch.sinc(2 * cutoff * t) * window).to(torch.float32)


def resample(audio: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Resample mono float audio [N] from `rate_in` to `rate_out` Hz; returns float32 [ceil(N * out / in)]."""
    samples = np.ascontiguousarray(audio, dtype=np.float32)
    if rate_in == rate_out or samples.size == 0:
        return samples
    g = math.gcd(rate_in, rate_out)
    step_in, step_out = rate_in // g, rate_out // g  # M input samples per L output samples
    cutoff = 0.5 * ROLLOFF * min(1.0, step_out / step_in)  # cycles per input sample
    half_width = math.ceil(ZERO_CROSSINGS / (2 * cutoff))
    n_out = math.ceil(samples.size * step_out / step_in)
    x = torch.from_numpy(samples)
    with torch.no_grad():
        if step_out <= _MAX_PHASES:
            out = _polyphase(x, step_in, step_out, cutoff, half_width, n_out)
        else:
            out = _blockwise(x, rate_in, rate_out, cutoff, half_width, n_out)
    return out.numpy()


def _polyphase(
    x: torch.Tensor, step_in: int, step_out: int, cutoff: float, half_width: int, n_out: int
) -> torch.Tensor:
    # output n * L + j is at input time n * M + j * M / L; it reads inputs n * M - half_width ... + M + half_width
    taps = torch.arange(-half_width, half_width + step_in, dtype=torch.float64)
    phase = torch.arange(step_out, dtype=torch.float64) * step_in / step_out
    kernel = _weights(taps.view(1, -1) - phase.view(-1, 1), cutoff, half_width)  # [L, K]
    blocks = math.ceil(n_out / step_out)
    needed = blocks * step_in + 2 * half_width + step_in
    padded = F.pad(x.view(1, 1, -1), (half_width, max(0, needed - half_width - x.numel())))
    y = F.conv1d(padded, kernel.unsqueeze(1), stride=step_in)[0, :, :blocks]  # [L, blocks]
    return y.transpose(0, 1).reshape(-1)[:n_out].contiguous()


def _blockwise(
    x: torch.Tensor, rate_in: int, rate_out: int, cutoff: float, half_width: int, n_out: int
) -> torch.Tensor:
    padded = F.pad(x, (half_width, half_width + 1))
    span = torch.arange(-half_width + 1, half_width + 1, dtype=torch.int64)  # taps around floor(t)
    out = torch.empty(n_out, dtype=torch.float32)
    for start in range(0, n_out, _BLOCK):
        n = torch.arange(start, min(start + _BLOCK, n_out), dtype=torch.int64)
        base = (n * rate_in) // rate_out  # floor of the input time, exact in integers
        frac = ((n * rate_in) % rate_out).to(torch.float64) / rate_out
        index = base.view(-1, 1) + span.view(1, -1)  # [n, 2 * half_width]
        weights = _weights(index.to(torch.float64) - (base.to(torch.float64) + frac).view(-1, 1), cutoff, half_width)
        out[start : start + n.numel()] = (padded[index + half_width] * weights).sum(dim=1)
    return out
