"""Golden parity: our decoder and encoder reproduce the reference implementation (qwen-tts 0.1.1).

The fixture (tests/fixtures/codec_golden/) is made by scripts/make_codec_golden.py: tiny random weights
written in the official audio_tokenizer/ layout, decoded and encoded by the reference package.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from breeze_worker.errors import CheckpointError
from breeze_worker.model.codec import load_codec, write_codec_checkpoint

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "codec_golden"


def test_fixture_is_small():
    total = sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file())
    assert total < 1_000_000


def test_decoder_matches_reference(golden, golden_codec):
    audio = golden_codec.decode(torch.from_numpy(golden["codes"]))
    expected = golden["expected_audio"]
    assert audio.dtype == torch.float32 and tuple(audio.shape) == expected.shape == (2, 10 * 1920)
    assert np.abs(expected).mean() > 0.05  # the reference produced real signal, not silence
    np.testing.assert_allclose(audio.numpy(), expected, atol=1e-4, rtol=0)


def test_streaming_decoder_matches_reference(golden, golden_codec):
    codes = torch.from_numpy(golden["codes"])
    state = golden_codec.new_stream(codes.shape[0])
    audio = torch.cat([golden_codec.decode_stream(codes[:, :, i : i + 3], state) for i in range(0, 10, 3)], -1)
    np.testing.assert_allclose(audio.numpy(), golden["expected_audio"], atol=1e-4, rtol=0)


def test_encoder_matches_reference(golden, golden_codec):
    codes = golden_codec.encode(golden["audio"])
    assert codes.dtype == torch.int64
    assert tuple(codes.shape) == golden["expected_codes"].shape == (9, 16)  # ceil(16000 / 1920)
    np.testing.assert_array_equal(codes.numpy(), golden["expected_codes"])


def test_written_checkpoint_round_trips(tmp_path, golden, golden_codec):
    folder = write_codec_checkpoint(golden_codec, tmp_path / "audio_tokenizer")
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen3_tts_tokenizer_12hz"
    assert {"encoder_config", "decoder_config", "encoder_valid_num_quantizers"} <= config.keys()
    ours = load_file(str(folder / "model.safetensors"))
    theirs = load_file(str(FIXTURE / "audio_tokenizer" / "model.safetensors"))
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    reloaded = load_codec(folder)
    codes = torch.from_numpy(golden["codes"])
    assert torch.equal(reloaded.decode(codes), golden_codec.decode(codes))


def test_loader_names_missing_and_misshaped_tensors(tmp_path, golden_codec):
    folder = write_codec_checkpoint(golden_codec, tmp_path / "audio_tokenizer")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["decoder.pre_conv.conv.bias"]
    tensors["decoder.pre_transformer.norm.weight"] = torch.ones(3)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing.*pre_conv\.conv\.bias.*mis-shaped.*norm\.weight"):
        load_codec(folder)


def test_loader_rejects_other_model_types(tmp_path, golden_codec):
    folder = write_codec_checkpoint(golden_codec, tmp_path / "audio_tokenizer")
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "mimi"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="qwen3_tts_tokenizer_12hz"):
        load_codec(folder)
    with pytest.raises(CheckpointError, match="codec config not found"):
        load_codec(tmp_path / "nowhere")


def test_the_golden_is_sensitive_to_every_code(golden, golden_codec):
    """A golden that decodes to a near-constant signal proves nothing: this one carries signal (std > 0.1),
    and changing any single code of the first row (each of the 16 codebooks x 10 frames, one at a time)
    moves its decoded audio by at least 1e-2 somewhere: 100x the 1e-4 the parity tests allow. The other
    row, decoded in the same batch, does not move at all."""
    codes = torch.from_numpy(golden["codes"])
    base = golden_codec.decode(codes)
    assert float(base.std()) > 0.1
    batch = codes.repeat(16 * 10, 1, 1)  # 160 pairs (first row changed, second untouched) in one decode
    for i, (book, frame) in enumerate((b, f) for b in range(16) for f in range(10)):
        batch[2 * i, book, frame] = (batch[2 * i, book, frame] + 37) % golden_codec.codebook_size
    out = golden_codec.decode(batch)
    moved = (out[0::2] - base[0]).abs().amax(dim=-1)
    assert float(moved.min()) >= 1e-2, moved.view(16, 10)
    assert float((out[1::2] - base[1]).abs().max()) < 1e-5
