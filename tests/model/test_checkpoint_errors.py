"""A broken checkpoint is a `CheckpointError` naming the file and the key or tensor, never a bare KeyError,
TypeError, ValueError or SafetensorError, and nothing wrong in it is silently accepted or converted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from breeze_worker.errors import CheckpointError
from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.loaded import GenerationDefaults
from breeze_worker.model.loader import INDEX_FILE, load_checkpoint, write_checkpoint

SHARD_1, SHARD_2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def written(tiny, tmp_path_factory) -> Path:
    return write_checkpoint(tiny, tmp_path_factory.mktemp("good"), dead_tensors=False)


@pytest.fixture
def ckpt(written, tmp_path) -> Path:
    """A private copy to break."""
    return Path(shutil.copytree(written, tmp_path / "ckpt"))


def _load_error(directory: Path) -> str:
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(directory, require_codec=False)
    return str(err.value)


def _edit_json(path: Path, edit) -> None:
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


def _weight_map(directory: Path) -> dict[str, str]:
    return json.loads((directory / INDEX_FILE).read_text())["weight_map"]


def test_the_untouched_copy_loads(ckpt, tiny):
    assert load_checkpoint(ckpt, require_codec=False).config == tiny.config


def test_index_without_weight_map(ckpt):
    _edit_json(ckpt / INDEX_FILE, lambda raw: raw.pop("weight_map"))
    message = _load_error(ckpt)
    assert INDEX_FILE in message and "weight_map" in message


def test_index_with_a_non_string_shard_name(ckpt):
    _edit_json(ckpt / INDEX_FILE, lambda raw: raw["weight_map"].update({"lm_head.weight": 3}))
    assert "weight_map['lm_head.weight'] is 3" in _load_error(ckpt)


def test_corrupt_shard_header_names_the_shard(ckpt):
    (ckpt / SHARD_2).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + b"\x00" * 64)
    message = _load_error(ckpt)
    assert f"shard {SHARD_2}" in message and "corrupt or truncated" in message


def test_truncated_shard_names_the_shard(ckpt):
    data = (ckpt / SHARD_1).read_bytes()
    (ckpt / SHARD_1).write_bytes(data[: len(data) // 2])
    message = _load_error(ckpt)
    assert SHARD_1 in message and ("truncated" in message)


def test_integer_typed_weight_is_rejected_not_converted(ckpt):
    name = "backbone_model.layers.0.mlp.up_proj.weight"
    shard = ckpt / _weight_map(ckpt)[name]
    tensors = load_file(str(shard))
    tensors[name] = torch.ones_like(tensors[name], dtype=torch.int64)
    save_file(tensors, str(shard))
    message = _load_error(ckpt)
    assert f"tensor {name} is stored as I64, not a floating-point type" in message


def test_tensor_in_a_shard_but_not_in_the_index_is_unexpected(ckpt):
    shard = ckpt / SHARD_2
    tensors = load_file(str(shard))
    tensors["backbone_model.layers.0.stowaway.weight"] = torch.zeros(2, 3)
    save_file(tensors, str(shard))
    message = _load_error(ckpt)
    assert (f"unexpected tensor backbone_model.layers.0.stowaway.weight with shape [2, 3] in shard {SHARD_2}: "
            f"{INDEX_FILE} does not list it") in message


def test_tensor_held_by_a_shard_the_index_does_not_place_it_in(ckpt):
    weight_map = _weight_map(ckpt)
    name = next(n for n, s in weight_map.items() if s == SHARD_1)
    other = ckpt / SHARD_2
    tensors = load_file(str(other))
    tensors[name] = load_file(str(ckpt / SHARD_1))[name]
    save_file(tensors, str(other))
    assert f"unexpected tensor {name} in shard {SHARD_2}: {INDEX_FILE} places it in {SHARD_1}" in _load_error(ckpt)


@pytest.mark.parametrize("section, key, value, expect", [
    ("backbone_config", "num_hidden_layers", None, "backbone_config.num_hidden_layers is None, expected an integer"),
    ("backbone_config", "hidden_size", "2048", "backbone_config.hidden_size is '2048', expected an integer"),
    ("depth_decoder_config", "num_attention_heads", 0, "depth_decoder_config.num_attention_heads is 0"),
    ("text_encoder_config", "layer_types", "full_attention", "text_encoder_config.layer_types is 'full_attention'"),
    ("text_encoder_config", "rms_norm_eps", "tiny", "text_encoder_config.rms_norm_eps is 'tiny', expected a finite"),
    (None, "tie_codebooks_embeddings", "false", "tie_codebooks_embeddings is 'false', expected true or false"),
    (None, "vocab_size", 2051.5, "vocab_size is 2051.5, expected an integer"),
    (None, "text_encoder_config", [1, 2], "text_encoder_config must be a JSON object, not list"),
    (None, "audio_token_id", None, "audio_token_id is None"),
])
def test_bad_config_values_name_their_key(tiny, section, key, value, expect):
    raw = tiny.config.to_dict()
    (raw[section] if section else raw)[key] = value
    with pytest.raises(CheckpointError) as err:
        BreezeConfig.from_dict(raw)
    assert expect in str(err.value) and str(err.value).startswith("config.json")


def test_missing_config_key_and_non_object_config(tiny, ckpt):
    raw = tiny.config.to_dict()
    del raw["backbone_config"]["num_key_value_heads"]
    with pytest.raises(CheckpointError, match="lacks the key 'backbone_config.num_key_value_heads'"):
        BreezeConfig.from_dict(raw)
    (ckpt / "config.json").write_text("[1, 2, 3]")
    assert "config.json (top level) must be a JSON object" in _load_error(ckpt)


def test_null_where_the_format_allows_it_still_parses(tiny):
    raw = tiny.config.to_dict()
    raw["backbone_config"]["head_dim"] = None  # falls back to hidden / heads, as before
    raw["text_encoder_config"]["attn_logit_softcapping"] = None
    raw["codec_config"] = None
    parsed = BreezeConfig.from_dict(raw)
    assert parsed.backbone.head_dim == 64 // 4 and parsed.codebook_size == 2048


@pytest.mark.parametrize("key, value", [("temperature", "hot"), ("temperature", -1.0), ("temperature", 1e-9),
                                        ("top_k", 2.5), ("top_k", True), ("top_p", 0.0), ("top_p", 1.5),
                                        ("repetition_penalty", 0), ("repetition_penalty", float("inf"))])
def test_bad_generation_config_values_name_their_key(key, value):
    with pytest.raises(CheckpointError, match=f"generation_config.json {key} is"):
        GenerationDefaults.from_generation_config({key: value})


def test_generation_config_in_a_checkpoint(ckpt):
    _edit_json(ckpt / "generation_config.json", lambda raw: raw.update(temperature="hot"))
    assert "generation_config.json temperature is 'hot'" in _load_error(ckpt)
    (ckpt / "generation_config.json").write_text('"just a string"')
    assert "generation_config.json must be a JSON object" in _load_error(ckpt)


def test_good_generation_config_values_are_read():
    got = GenerationDefaults.from_generation_config({"temperature": 0.7, "top_k": 30, "top_p": 0.95,
                                                     "repetition_penalty": 1.2, "do_sample": True})
    assert (got.temperature, got.top_k, got.top_p, got.repetition_penalty) == (0.7, 30, 0.95, 1.2)
    assert GenerationDefaults.from_generation_config({"temperature": None}) == GenerationDefaults()
