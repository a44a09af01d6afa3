"""The codec's graphed streaming step on the GPU against the same step run eagerly and against the codec's
own streaming decode (the full-size decoder, seeded random weights, strict FP32 convolutions; the worker's
default, TF32 where the device has it, is compared with them by the last test).

Per slot bucket: the CUDA graph's replay gives the eager step's audio at the same width bit for bit (the graph
captures what the step runs, each convolution in the form tuned for that bucket); against the codec's own
`Codec.decode_stream` the audio agrees to >= 90 dB SNR (the forms may sum in another order; about 100 dB was
measured between the tuned and the library forms). The compiled step (the `codec_compile_slots` setting) gives the
uncompiled step's audio to >= 90 dB.
"""

from __future__ import annotations

import math

import pytest
import torch
from gpu_support import release_device_memory

from breeze_worker.engine.codec_graphs import SlotBatch
from breeze_worker.measure.models import decoder_only_codec

pytestmark = pytest.mark.gpu

FRAMES = 6


@pytest.fixture(scope="module")
def codec(cuda):
    codec = decoder_only_codec(seed=0, device=cuda)
    yield codec
    del codec
    release_device_memory()


def snr_db(test: torch.Tensor, reference: torch.Tensor) -> float:
    noise = float((test.double() - reference.double()).pow(2).sum())
    signal = float(reference.double().pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


@pytest.mark.parametrize("rows", [1, 4])
def test_graphed_codec_step_equals_eager(codec, cuda, rows, write_figures):
    generator = torch.Generator().manual_seed(rows)
    frames = [torch.randint(0, 2048, (rows, 16), generator=generator) for _ in range(FRAMES)]
    # true FP32, and cuDNN's benchmark mode as the capture uses it: every step below finds the algorithms the
    # capture benchmarked for these shapes (and the convolution forms it tuned), so the eager runs compute what
    # the graph computes
    with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=False):
        graphed = SlotBatch(codec.decoder, rows, tf32=False, compile=False)
        eager = SlotBatch(codec.decoder, rows, use_graphs=False, tf32=False, compile=False)
        assert graphed.graphed, graphed.fallback_reason
        state = codec.new_stream(rows)
        same, snrs = 0, []
        for frame in frames:
            a = graphed.step(frame.pin_memory()).cpu()
            b = eager.step(frame.pin_memory()).cpu()
            with torch.inference_mode():
                c = codec.decode_stream(frame.unsqueeze(-1).to(cuda), state).cpu()
            assert a.shape == c.shape and bool(torch.isfinite(a).all())
            same += int(torch.equal(a, b))
            snrs.append(snr_db(a, c))
    write_figures(f"codec_graphs_{rows}", {"rows": rows, "frames": FRAMES, "graph_equals_eager": same / FRAMES,
                                          "snr_db_vs_decode_stream": snrs})
    assert same == FRAMES
    assert min(snrs) >= 90.0, snrs


def test_compiled_codec_step_matches_the_uncompiled_one(codec, cuda, write_figures):
    """The `codec_compile_slots` setting (the step through Inductor before its capture, 4 slots): the same audio as
    the uncompiled graphed step to >= 90 dB (fused element-wise kernels round differently; ~101 dB measured)."""
    rows = 4
    generator = torch.Generator().manual_seed(11)
    frames = [torch.randint(0, 2048, (rows, 16), generator=generator) for _ in range(FRAMES)]
    with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=False):
        compiled = SlotBatch(codec.decoder, rows, tf32=False, compile=True)
        plain = SlotBatch(codec.decoder, rows, tf32=False, compile=False)
        assert compiled.compiled and compiled.graphed, compiled.fallback_reason
        snrs = [snr_db(compiled.step(f.pin_memory()).cpu(), plain.step(f.pin_memory()).cpu()) for f in frames]
    write_figures("codec_compiled", {"rows": rows, "frames": FRAMES, "compile_s": compiled.compile_s,
                                     "snr_db_vs_uncompiled": snrs})
    assert min(snrs) >= 90.0, snrs


def test_tf32_codec_against_strict_fp32(codec, cuda, write_figures):
    """The worker's default on devices with TF32 (the `codec_tf32` setting, as PyTorch's own cuDNN default):
    the same audio as strict FP32 to >= 40 dB SNR over 24 frames of 8 streams (TF32 rounds the convolutions'
    operands to a 10-bit mantissa; about 51 dB was measured on an H200 before). The figure is the parity
    of our default against strict FP32."""
    rows, frames_n = 8, 24
    generator = torch.Generator().manual_seed(21)
    frames = [torch.randint(0, 2048, (rows, 16), generator=generator) for _ in range(frames_n)]
    outs = {}
    for tf32 in (False, True):
        with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=tf32):
            batch = SlotBatch(codec.decoder, rows, tf32=tf32, compile=False)
            outs[tf32] = torch.cat([batch.step(f.pin_memory()).cpu() for f in frames], dim=-1)
    snr = snr_db(outs[True], outs[False])
    per_row = [snr_db(outs[True][r], outs[False][r]) for r in range(rows)]
    write_figures("codec_tf32_vs_fp32", {"rows": rows, "frames": frames_n, "snr_db": snr,
                                          "snr_db_min_row": min(per_row), "snr_db_per_row": per_row})
    assert bool(torch.isfinite(outs[True]).all())
    assert snr >= 40.0 and min(per_row) >= 35.0, per_row
