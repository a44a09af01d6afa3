"""The official checkpoint layout: written at tiny size, loaded back exactly; errors name tensor and shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import breeze_worker.model.loader as loader
from breeze_worker.errors import CheckpointError
from breeze_worker.model.loader import load_checkpoint, write_checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tiny, tmp_path_factory) -> Path:
    return write_checkpoint(tiny, tmp_path_factory.mktemp("ckpt"))


def _same_weights(a, b) -> None:
    sa, sb = a.lm.state_dict(), b.lm.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def test_written_layout_is_the_official_one(checkpoint):
    names = sorted(p.name for p in checkpoint.iterdir())
    assert names == ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                     "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json"]
    weight_map = json.loads((checkpoint / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(weight_map.values())) == 2
    assert "depth_decoder.model.embed_tokens.weight" in weight_map
    assert "backbone_model.embed_tokens.embed_audio_tokens.weight" not in weight_map  # tied: stored once
    assert "embed_text_tokens.weight" in weight_map and any(n.startswith("codec_model.") for n in weight_map)
    raw = json.loads((checkpoint / "config.json").read_text())
    assert raw["rope_theta"] == 500_000.0 and raw["rms_norm_eps"] == 1e-5  # decoys present
    assert raw["backbone_config"]["rope_theta"] == 1_000_000.0


def test_load_round_trip_reads_no_dead_tensor_and_binds_the_tie(tiny, checkpoint, monkeypatch):
    read: list[str] = []
    real_read = loader._read_shard_tensors

    def recording(path, names, params, staging):
        read.extend(names)
        return real_read(path, names, params, staging)

    monkeypatch.setattr(loader, "_read_shard_tensors", recording)
    loaded = load_checkpoint(checkpoint, require_codec=False)
    assert read and not [n for n in read if n.startswith(("embed_text_tokens", "codec_model"))]
    assert sorted(read) == sorted(loaded.lm.state_dict())  # nothing missing, nothing extra
    _same_weights(tiny, loaded)
    assert loaded.lm.embed_audio_tokens is loaded.lm.depth_decoder.model.embed_tokens
    assert not loaded.is_tiny_default and loaded.config == tiny.config
    assert loaded.generation_defaults == tiny.generation_defaults
    assert loaded.tokenizer.encode("[S0]abc", True) == tiny.tokenizer.encode("[S0]abc", True)


def test_decoy_keys_change_nothing(tiny, tmp_path):
    decoys = {"rope_theta": 1.0, "rope_scaling": {"rope_type": "linear", "factor": 9.0}, "rms_norm_eps": 0.5,
              "max_position_embeddings": 7}
    loaded = load_checkpoint(write_checkpoint(tiny, tmp_path, config_overrides=decoys, dead_tensors=False),
                             require_codec=False)
    assert loaded.config == tiny.config
    _same_weights(tiny, loaded)
    ids = torch.tensor([[2, 300, 301, 302]])
    with torch.no_grad():
        a = tiny.lm.encode_text(ids, torch.ones_like(ids))
        b = loaded.lm.encode_text(ids, torch.ones_like(ids))
        ha = tiny.lm.backbone(a, torch.arange(4)[None], None, tiny.lm.new_backbone_cache())
        hb = loaded.lm.backbone(b, torch.arange(4)[None], None, loaded.lm.new_backbone_cache())
    assert torch.equal(ha, hb)


def _edit_shard(directory: Path, edit) -> None:
    weight_map = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    for shard in sorted(set(weight_map.values())):
        tensors = load_file(str(directory / shard))
        edit(tensors)
        save_file(tensors, str(directory / shard))


def test_mismatched_shape_names_the_tensor_and_both_shapes(tiny, tmp_path):
    write_checkpoint(tiny, tmp_path, dead_tensors=False)
    name = "backbone_model.layers.1.mlp.up_proj.weight"

    def edit(tensors):
        if name in tensors:
            tensors[name] = torch.zeros(5, 64)

    _edit_shard(tmp_path, edit)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path, require_codec=False)
    assert name in str(err.value) and "[5, 64]" in str(err.value) and "[128, 64]" in str(err.value)


def test_missing_tensor_is_named(tiny, tmp_path):
    write_checkpoint(tiny, tmp_path, dead_tensors=False)
    name = "depth_decoder.codebooks_head.weight"
    _edit_shard(tmp_path, lambda tensors: tensors.pop(name, None))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path, require_codec=False)
    assert f"missing tensor {name}" in str(err.value) and "[15, 32, 2051]" in str(err.value)


def test_unexpected_tensor_is_named(tiny, tmp_path):
    write_checkpoint(tiny, tmp_path, dead_tensors=False)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    save_file({"backbone_model.layers.9.extra.weight": torch.zeros(3, 4)}, str(tmp_path / "extra.safetensors"))
    index["weight_map"]["backbone_model.layers.9.extra.weight"] = "extra.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path, require_codec=False)
    assert "unexpected tensor backbone_model.layers.9.extra.weight with shape [3, 4]" in str(err.value)


def test_load_in_bfloat16_keeps_rope_tables_in_float32(checkpoint):
    loaded = load_checkpoint(checkpoint, dtype=torch.bfloat16, require_codec=False)
    assert loaded.dtype == torch.bfloat16
    assert loaded.lm.backbone_model.rotary.inv_freq.dtype == torch.float32
    assert torch.equal(loaded.lm.codebook_offsets, torch.arange(16) * 2051)


_MEMORY_PROBE = textwrap.dedent("""
    import sys, torch
    from breeze_worker.model.loader import load_checkpoint

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024

    open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
    before = status("VmRSS")
    model = load_checkpoint(sys.argv[1], require_codec=False)
    peak = status("VmHWM")
    live = sum(t.numel() * t.element_size() for t in model.lm.state_dict().values())
    print(peak - before, live)
""")


def test_peak_host_memory_during_load_stays_near_the_live_weights(tmp_path):
    import dataclasses

    from breeze_worker.model.lm.config import BreezeConfig
    from breeze_worker.model.tiny import tiny_model

    tiny_cfg = BreezeConfig.tiny()
    config = dataclasses.replace(  # ~40 M parameters, ~160 MB in FP32: well above interpreter noise
        tiny_cfg,
        backbone=dataclasses.replace(tiny_cfg.backbone, hidden_size=512, intermediate_size=2048,
                                     num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=64),
        depth=dataclasses.replace(tiny_cfg.depth, hidden_size=256, intermediate_size=1024,
                                  backbone_hidden_size=512, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=64),
    )
    big = tiny_model(seed=1, config=config, with_codec=False)
    live = sum(t.numel() * t.element_size() for t in big.lm.state_dict().values())
    assert live > 100e6
    write_checkpoint(big, tmp_path)
    del big
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")))
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(tmp_path)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    peak_delta, live_loaded = map(int, out.stdout.split())
    assert live_loaded == live
    print(f"load peak {peak_delta / live:.3f}x the live weights")
    assert peak_delta <= 1.3 * live, f"peak {peak_delta / 1e6:.0f} MB for {live / 1e6:.0f} MB of weights"


def test_codec_travels_with_the_checkpoint(tmp_path):
    from breeze_worker.model.tiny import tiny_model

    model = tiny_model(seed=2)
    assert model.codec is not None
    loaded = load_checkpoint(write_checkpoint(model, tmp_path, dead_tensors=False))
    assert (tmp_path / "audio_tokenizer").is_dir()
    assert loaded.codec is not None and loaded.codec.sample_rate == model.codec.sample_rate == 24000


def test_checkpoint_without_audio_tokenizer_is_refused_by_name(tiny, checkpoint):
    assert not (checkpoint / "audio_tokenizer").exists()
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(checkpoint)
    assert "audio_tokenizer" in str(err.value) and "is missing" in str(err.value)
    assert load_checkpoint(checkpoint, require_codec=False).codec is None  # the explicit LM-only opt-out


def test_worker_start_on_a_checkpoint_without_codec_names_the_folder(checkpoint):
    from breeze_worker.config import EngineSettings
    from breeze_worker.engine.runtime import Runtime

    with pytest.raises(CheckpointError, match="audio_tokenizer"):  # not an AttributeError on codec=None
        Runtime.load(EngineSettings(model_dir=checkpoint, device="cpu", precision="fp32"))


class _ShortReads:
    """A shard file whose reads return at most `limit` bytes, as a network filesystem's (or any read of
    over 2 GiB on Linux) may: a read that returns less than asked is not the end of the file."""

    def __init__(self, file, limit: int):
        self._file, self._limit = file, limit
        self.name = file.name

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        return self._file.readinto(view[: self._limit])

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()


def test_short_reads_still_fill_every_tensor(checkpoint, monkeypatch):
    """Every tensor equals what safetensors itself reads from the shard, whatever size each read returns."""
    real_open = open
    monkeypatch.setattr(loader, "open", lambda path, *a, **k: _ShortReads(real_open(path, *a, **k), 5),
                        raising=False)
    model = load_checkpoint(checkpoint, require_codec=False)
    state = model.lm.state_dict()
    weight_map = json.loads((checkpoint / "model.safetensors.index.json").read_text())["weight_map"]
    checked = 0
    for shard in sorted(set(weight_map.values())):
        for name, expected in load_file(str(checkpoint / shard)).items():
            if name in state:
                assert torch.equal(state[name], expected), name
                checked += 1
    assert checked > 10
