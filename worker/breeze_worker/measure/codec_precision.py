"""The codec's fp16-mixed precision against its FP32 one (`breeze-worker precision-check --codec`).

The same codes are decoded by the same decoder twice, in FP32 and in fp16-mixed (model/codec/codec.py), both
ways the worker decodes: one-shot (`Codec.decode`) and streamed one frame at a time (`decode_stream`, as the
engine does: every convolution with its left context from the stream state). The measure is the signal-to-noise
ratio of the fp16-mixed audio against the FP32 audio, per row, in dB: 10 log10(sum ref^2 / sum (ref - test)^2).

`SNR_THRESHOLD_DB`: fp16-mixed is acceptable where every row of both ways stays at or above 40 dB, an error
of at most 1% of the signal's RMS amplitude. FP16's 11 significant bits put one rounding at about -66 dB; the
decoder's ~35 rounded convolution inputs in a chain cost about 15 dB of that (46-52 dB measured on random
weights, tiny and full size, on the CPU), so 40 dB keeps a margin while a broken conversion (a wrong dtype,
a lost bias, an overflow) lands far below it. It is a numerical criterion, not a listening test.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from breeze_worker.model.codec.codec import Codec

SNR_THRESHOLD_DB = 40.0


def snr_db(reference: np.ndarray | torch.Tensor, test: np.ndarray | torch.Tensor) -> list[float]:
    """Per row of [B, N] (or one row [N]) audio: 10 log10(sum reference^2 / sum (reference - test)^2) in dB
    (infinity where they are equal)."""
    ref = np.atleast_2d(np.asarray(reference, dtype=np.float64))
    out = np.atleast_2d(np.asarray(test, dtype=np.float64))
    if ref.shape != out.shape:
        raise ValueError(f"audio shapes differ: {ref.shape} vs {out.shape}")
    power = (ref ** 2).sum(axis=1)
    noise = ((ref - out) ** 2).sum(axis=1)
    return [math.inf if n == 0 else 10.0 * math.log10(p / n) if p > 0 else -math.inf for p, n in zip(power, noise)]


@torch.no_grad()
def _decode_both(codec: Codec, codes: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """One-shot and streamed (one frame per call) audio of `codes` [B, 16, T], on the host."""
    one_shot = codec.decode(codes).float().cpu().numpy()
    state = codec.new_stream(codes.shape[0])
    device_codes = codes.to(codec.device)
    streamed = torch.cat([codec.decode_stream(device_codes[:, :, t:t + 1], state)
                          for t in range(codes.shape[-1])], dim=-1).float().cpu().numpy()
    return one_shot, streamed


def half_copy(codec: Codec) -> tuple[Codec, list[str]]:
    """A copy of an FP32 codec's decoder in fp16-mixed (the encoder shared), and the convolutions it holds in
    FP16: the original keeps its FP32 weights."""
    if codec.precision != "fp32":
        raise ValueError(f"the codec runs in {codec.precision}: the comparison needs its FP32 weights")
    half = Codec(codec.config, copy.deepcopy(codec.decoder), codec.encoder)
    return half, half.set_precision("fp16-mixed")


def codec_precision_check(codec: Codec, codes: torch.Tensor, golden: np.ndarray | None = None) -> dict:
    """fp16-mixed against FP32 on `codes` [B, 16, T] (module docstring), `codec` the FP32 one (a half-precision
    copy of its decoder is made and dropped); with `golden` [B, T * 1920] (audio the reference implementation
    decoded from the same codes, e.g. tests/fixtures/codec_golden) each precision's one-shot audio against it
    too."""
    half, halves = half_copy(codec)
    ref_one, ref_stream = _decode_both(codec, codes)
    half_one, half_stream = _decode_both(half, codes)
    del half
    rows = {"one_shot": snr_db(ref_one, half_one), "streamed": snr_db(ref_stream, half_stream)}
    worst = min(min(v) for v in rows.values())
    out = {"frames": int(codes.shape[-1]), "rows": int(codes.shape[0]), "fp16_convolutions": len(halves),
           "snr_db": rows, "min_snr_db": worst, "threshold_db": SNR_THRESHOLD_DB,
           "passes": bool(worst >= SNR_THRESHOLD_DB),
           "fp32_streamed_vs_one_shot_snr_db": snr_db(ref_one, ref_stream),
           "rms": float(np.sqrt((ref_one ** 2).mean()))}
    if golden is not None:
        out["against_golden_snr_db"] = {"fp32": snr_db(golden, ref_one), "fp16-mixed": snr_db(golden, half_one)}
    return out
