"""`breeze-worker make-checkpoint`: the official layout with seeded random weights, read back by the loader
(as any downloaded checkpoint is), the same files for the same seed, and a notice that it is not speech."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import torch

from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import SynthesisRequest
from breeze_worker.model.loader import load_checkpoint
from breeze_worker.model.synthetic import NOTICE, config_for, released_encoder_config

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
OFFICIAL = {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors.index.json",
            "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", NOTICE}


def _make(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "breeze_worker.cli", "make-checkpoint", "--size", "tiny", *extra,
                           str(out)], capture_output=True, text=True, timeout=300, env=ENV)


def _digest(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_tiny_checkpoint_loads_and_generates(tmp_path):
    proc = _make(tmp_path / "a", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    assert "NOT speech" in proc.stdout
    files = {p.name for p in (tmp_path / "a").iterdir()}
    assert OFFICIAL | {"audio_tokenizer"} == files
    assert {p.name for p in (tmp_path / "a" / "audio_tokenizer").iterdir()} == {"config.json", "model.safetensors"}
    assert "NOT speech" in (tmp_path / "a" / NOTICE).read_text()
    model = load_checkpoint(tmp_path / "a", device="cpu", dtype=torch.float32)
    assert model.lm.lm_head.weight.shape == (2052, config_for("tiny").hidden_size)
    assert model.codec is not None and model.codec.encoder is not None
    request = resolve_request(SynthesisRequest(text="hello", seed=1, max_frames=2), model.generation_defaults,
                              None, tokenizer=model.tokenizer)
    frames = list(EagerFrameGenerator(model, request, "cpu"))
    assert len(frames) == 2 and all(int(f.max()) < 2048 for f in frames)
    assert model.codec.decode(torch.stack(frames, -1)[None]).shape == (1, 2 * 1920)

    assert _make(tmp_path / "b", "--seed", "3").returncode == 0  # the same seed: the same bytes
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _make(tmp_path / "c", "--seed", "4").returncode == 0
    assert _digest(tmp_path / "a")["model-00001-of-00002.safetensors"] != _digest(tmp_path / "c")[
        "model-00001-of-00002.safetensors"]


def test_a_directory_with_files_is_refused(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    proc = _make(tmp_path)
    assert proc.returncode == 2 and "is not empty" in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_the_full_size_codec_config_is_the_released_one():
    """The full-size codec block matches the released audio_tokenizer/config.json's encoder (transformers'
    MimiConfig defaults) and decoder sizes, so the worker runs the real codec shapes."""
    from transformers import MimiConfig

    from breeze_worker.model.codec.config import released_decoder_config
    from breeze_worker.model.codec.encoder import mimi_config

    defaults = MimiConfig().to_dict()
    ours = released_encoder_config()
    differ = {k: (defaults[k], v) for k, v in ours.items() if k in defaults and not k.startswith("_")
              and defaults[k] != v}
    assert differ == {} and mimi_config(ours).frame_rate == 12.5
    decoder = released_decoder_config()
    assert (decoder.hidden_size, decoder.intermediate_size, decoder.codebook_dim, decoder.attention_head_dim) == (
        512, 1024, 512, 64)


def test_the_full_size_tokenizer_counts_tokens_as_a_real_vocabulary_does():
    """The benchmarks' texts come to 1-1.5 tokens a word (a 262k SentencePiece vocabulary's rate for English),
    not one a letter, through tokenizer.json as the loader reads it; other text still spells and round-trips."""
    from tokenizers import Tokenizer

    from breeze_client.bench import LABELS
    from breeze_worker.model.synthetic import WORDS
    from breeze_worker.model.tokenizer import BreezeTokenizer

    config = config_for("full")
    written = BreezeTokenizer.tiny(config, WORDS)
    tokenizer = BreezeTokenizer(Tokenizer.from_str(written.to_str()), config)  # as tokenizer.json is read
    letters = BreezeTokenizer.tiny(config)
    for label in LABELS.values():
        words = len(label.text.split())
        ids = tokenizer.encode(label.text)
        assert len(ids) <= 1.5 * words, (label.name, len(ids), words)
        assert len(letters.encode(label.text)) >= 4 * words
        assert tokenizer.decode(ids) == label.text and max(ids) < config.text_vocab_size
    odd = "Zebras quizzically vex 42 façades."
    assert tokenizer.decode(tokenizer.encode(odd)) == odd
    assert len(tokenizer.encode(" zebra")) == len(" zebra")  # not a listed word: spelled
    assert len(tokenizer.encode(" junction")) == 1
