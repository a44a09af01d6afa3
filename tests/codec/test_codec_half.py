"""The codec's fp16-mixed precision (FP16 convolutions, everything else FP32; model/codec/codec.py) on the CPU:

- on the golden fixture (codes decoded by the reference implementation, qwen-tts, in FP32): one-shot and
  streamed one frame at a time, the fp16-mixed audio is within measure/codec_precision.py's 40 dB SNR of the
  reference's audio, and so is FP32's (far above it);
- `codec_precision_check` measures it on other codes, leaving the FP32 codec as it was;
- what stays FP32: the stream state, the output, SnakeBeta's parameters; the weights cannot silently go back;
- the worker applies the `codec_precision` setting at load.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from breeze_worker.measure.codec_precision import SNR_THRESHOLD_DB, codec_precision_check, half_copy, snr_db


def test_snr_arithmetic():
    ref = np.array([[1.0, -1.0, 1.0, -1.0]])
    assert snr_db(ref, ref) == [float("inf")]
    assert snr_db(ref, ref * 1.01)[0] == pytest.approx(40.0)  # a 1% amplitude error is 40 dB
    assert snr_db(ref, ref * 1.1)[0] == pytest.approx(20.0)
    with pytest.raises(ValueError, match="shapes differ"):
        snr_db(ref, ref[:, :2])


def test_half_codec_against_the_reference_implementations_golden_audio(golden, golden_codec):
    codes = torch.from_numpy(golden["codes"])
    expected = golden["expected_audio"]
    half, halves = half_copy(golden_codec)
    assert len(halves) > 20 and golden_codec.precision == "fp32" and half.precision == "fp16-mixed"
    one_shot = half.decode(codes)
    state = half.new_stream(codes.shape[0])
    streamed = torch.cat([half.decode_stream(codes[:, :, t:t + 1], state) for t in range(codes.shape[-1])], -1)
    assert one_shot.dtype == streamed.dtype == torch.float32
    assert all(t.dtype == torch.float32 for t in (*state.contexts, *state.keys, *state.values))
    for audio in (one_shot, streamed):
        assert min(snr_db(expected, audio.numpy())) >= SNR_THRESHOLD_DB
    assert min(snr_db(expected, golden_codec.decode(codes).numpy())) > 100  # FP32 is the reference's arithmetic
    # SnakeBeta's log-scale parameters stay FP32 (their exp overflows in half precision)
    assert all(p.dtype == torch.float32 for n, p in half.decoder.named_parameters() if n.endswith(("alpha", "beta")))


def test_the_check_measures_other_codes_and_leaves_the_fp32_codec_alone(golden, golden_codec):
    before = {n: p.clone() for n, p in golden_codec.decoder.named_parameters()}
    codes = torch.randint(0, golden_codec.codebook_size, (2, 16, 7), generator=torch.Generator().manual_seed(5))
    result = codec_precision_check(golden_codec, codes, golden=None)
    assert result["frames"] == 7 and result["rows"] == 2 and result["threshold_db"] == SNR_THRESHOLD_DB
    assert len(result["snr_db"]["one_shot"]) == len(result["snr_db"]["streamed"]) == 2
    assert result["passes"] and result["min_snr_db"] >= SNR_THRESHOLD_DB and result["min_snr_db"] < 90
    assert min(result["fp32_streamed_vs_one_shot_snr_db"]) > 100  # streaming is the one-shot decode in FP32
    with_golden = codec_precision_check(golden_codec, torch.from_numpy(golden["codes"]), golden["expected_audio"])
    assert min(with_golden["against_golden_snr_db"]["fp32"]) > 100
    assert min(with_golden["against_golden_snr_db"]["fp16-mixed"]) >= SNR_THRESHOLD_DB
    assert golden_codec.precision == "fp32"
    assert all(torch.equal(before[n], p) for n, p in golden_codec.decoder.named_parameters())


def test_precision_is_one_way_and_survives_a_move(golden_codec):
    half, _ = half_copy(golden_codec)
    with pytest.raises(ValueError, match="rounded for fp16-mixed"):
        half.set_precision("fp32")
    with pytest.raises(ValueError, match="one of fp32, fp16-mixed"):
        half.set_precision("bf16")
    half.to("cpu")  # the facade's move keeps the codec's precision
    assert half.decoder.pre_conv.conv.weight.dtype == torch.float16
    with pytest.raises(ValueError, match="needs its FP32 weights"):
        half_copy(half)


def test_the_worker_loads_its_codec_in_the_setting(monkeypatch):
    from breeze_worker.config import EngineSettings
    from breeze_worker.engine.runtime import Runtime

    torch.set_num_threads(1)
    runtime = Runtime.load(EngineSettings(device="cpu", codec_precision="fp16-mixed", max_active_streams=1))
    assert runtime.codec.precision == "fp16-mixed" and "codec fp16-mixed" in runtime.description
    assert runtime.codec.decoder.pre_conv.conv.weight.dtype == torch.float16
    assert Runtime.load(EngineSettings(device="cpu", max_active_streams=1)).codec.precision == "fp32"
