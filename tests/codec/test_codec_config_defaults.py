"""A key absent from audio_tokenizer/config.json gets the value the reference implementation gives it.

`tests/fixtures/codec_golden/reference_defaults.json` was recorded from the reference package itself
(qwen-tts 0.1.1 on transformers 4.57.3, by scripts/make_codec_golden.py): its decoder_config defaults, its
top-level defaults, the attention head size it derives when `head_dim` is absent, and whether it can build a
decoder without `codebook_dim`. Each key is removed from the released config one at a time and parsed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from breeze_worker.errors import CheckpointError
from breeze_worker.model.codec.config import CodecConfig, DecoderConfig, released_decoder_config, tiny_codec_config

REFERENCE = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "codec_golden"
                        / "reference_defaults.json").read_text())
OURS = {f.name for f in dataclasses.fields(DecoderConfig)}
# keys the reference defaults but that change nothing at inference (training-only or unused by its decoder)
NOT_USED = {"attention_dropout", "max_position_embeddings"}


def _released() -> dict:
    """The released decoder's config.json (head_dim 64 and codebook_dim 512 spelled out, as it ships)."""
    return CodecConfig(decoder=released_decoder_config(), encoder=tiny_codec_config().encoder).to_dict()


def test_every_reference_decoder_key_is_known():
    assert set(REFERENCE["decoder_config"]) - NOT_USED <= OURS
    assert "codebook_dim" not in REFERENCE["decoder_config"] and "head_dim" not in REFERENCE["decoder_config"]


@pytest.mark.parametrize("key", sorted(set(REFERENCE["decoder_config"]) - NOT_USED))
def test_an_absent_decoder_key_gets_the_reference_default(key):
    raw = _released()
    raw["decoder_config"].pop(key)
    try:
        parsed = CodecConfig.from_dict(raw).decoder
    except CheckpointError as exc:  # a default that contradicts a kept released value: named, not silent
        pytest.fail(f"removing {key} made the config invalid: {exc}")
    want = REFERENCE["decoder_config"][key]
    got = getattr(parsed, key)
    assert (list(got) if isinstance(got, tuple) else got) == want, key


def test_an_absent_head_dim_is_derived_as_the_reference_does():
    case = REFERENCE["head_dim_when_absent"]
    raw = _released()
    raw["decoder_config"].pop("head_dim")
    raw["decoder_config"].update(hidden_size=case["hidden_size"], num_attention_heads=case["num_attention_heads"],
                                 num_key_value_heads=case["num_attention_heads"])
    assert CodecConfig.from_dict(raw).decoder.attention_head_dim == case["head_dim"] == 96 // 4


def test_an_absent_codebook_dim_is_refused_by_name():
    assert REFERENCE["decoder_without_codebook_dim"].startswith("AttributeError")  # the reference cannot either
    raw = _released()
    raw["decoder_config"].pop("codebook_dim")
    with pytest.raises(CheckpointError, match="no 'codebook_dim'"):
        CodecConfig.from_dict(raw)


@pytest.mark.parametrize("key", sorted(REFERENCE["top_level"]))
def test_an_absent_top_level_key_gets_the_reference_default(key):
    raw = _released()
    raw.pop(key)
    assert getattr(CodecConfig.from_dict(raw), key) == REFERENCE["top_level"][key]


def test_a_rope_scaling_we_do_not_implement_is_refused():
    raw = _released()
    raw["decoder_config"]["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(CheckpointError, match="rope_scaling"):
        CodecConfig.from_dict(raw)
    raw["decoder_config"]["rope_scaling"] = {"rope_type": "default"}
    assert CodecConfig.from_dict(raw).decoder.rope_theta == 10000.0
