"""The codec's reference encoder is read when first needed (model/codec/loader.py): loading a checkpoint and
decoding never import transformers; the first encode (or `load_encoder`, which the worker's start-up calls once
serving) builds it from the checkpoint and encodes exactly as an encoder loaded up front; concurrent first
callers share one build; a checkpoint whose encoder tensors are broken loads, decodes, and fails only the
encode, naming the tensors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from breeze_worker.errors import CheckpointError
from breeze_worker.model.codec import load_codec
from breeze_worker.model.codec.tiny import tiny_codec, write_codec_checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    codec = tiny_codec(seed=4)
    directory = write_codec_checkpoint(codec, tmp_path_factory.mktemp("codec"))
    return codec, directory


def _speech(seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(24000 * seconds)) / 24000
    return (0.3 * np.sin(2 * np.pi * 180 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)


def test_loading_and_decoding_import_no_transformers(written):
    _, directory = written
    probe = ("import sys, torch\nfrom breeze_worker.model.codec import load_codec\n"
             f"codec = load_codec({str(directory)!r})\n"
             "codec.decode(torch.zeros(1, 16, 2, dtype=torch.long))\n"
             "before = 'transformers' in sys.modules\ncodec.encode(torch.zeros(4000))\n"
             "print(before, 'transformers' in sys.modules, codec.encoder_loaded)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True", "True"]


def test_the_first_encode_gives_the_codes_of_an_encoder_loaded_up_front(written):
    original, directory = written
    codec = load_codec(directory)
    assert not codec.encoder_loaded
    wav = _speech()
    results: list[torch.Tensor] = []
    threads = [threading.Thread(target=lambda: results.append(codec.encode(wav))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert codec.encoder_loaded and len(results) == 3
    want = original.encode(wav)
    assert all(torch.equal(r, want) for r in results)
    assert codec.encoder is codec.load_encoder()  # built once


def test_a_broken_encoder_fails_the_encode_not_the_load(written, tmp_path):
    _, directory = written
    broken = tmp_path / "audio_tokenizer"
    broken.mkdir()
    (broken / "config.json").write_text((directory / "config.json").read_text())
    tensors = load_file(str(directory / "model.safetensors"))
    victim = sorted(k for k in tensors if k.startswith("encoder."))[0]
    tensors[victim] = torch.zeros(3, 3)
    save_file(tensors, str(broken / "model.safetensors"))
    codec = load_codec(broken)
    assert codec.decode(torch.zeros(1, 16, 2, dtype=torch.long)).shape == (1, 2 * 1920)
    with pytest.raises(CheckpointError, match=victim.replace(".", r"\.")):
        codec.encode(_speech(0.5))
    json.loads((broken / "config.json").read_text())  # the directory is as written
