"""Resampling of reference audio to the codec's rate, exactly as the reference implementation does it.

The reference (qwen-tts' tokenizer, which Breeze TTS 2 encodes references with) loads a file as float32,
averages the channels, and calls `librosa.resample` with its defaults: soxr at high quality
(`soxr_hq`), then the result trimmed or zero-padded to ceil(N * rate_out / rate_in) samples, returned as
float32. We call soxr the same way, so a reference at any rate gives the same samples, hence the same
codes, as the reference path (tests/codec/test_resample_reference.py checks it against librosa itself).
"""

from __future__ import annotations

import math

import numpy as np

QUALITY = "soxr_hq"  # librosa.resample's default res_type


def resample(audio: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Resample mono float audio [N] from `rate_in` to `rate_out` Hz; returns float32 [ceil(N * out / in)]."""
    import soxr  # here: the codec's other paths (decoding) do not need it

    samples = np.ascontiguousarray(audio, dtype=np.float32)
    if rate_in == rate_out or samples.size == 0:
        return samples
    out = soxr.resample(samples, rate_in, rate_out, quality=QUALITY)
    size = math.ceil(samples.size * (float(rate_out) / rate_in))  # librosa's rounding, to the sample
    if out.shape[0] > size:
        out = out[:size]
    elif out.shape[0] < size:
        out = np.pad(out, (0, size - out.shape[0]))
    return np.asarray(out, dtype=np.float32)
