"""Shared fixtures of the codec tests: the tiny codec and real speech made with espeak-ng + sox."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from host_tools import need_tool

from breeze_worker.model.codec import Codec, load_codec, tiny_codec

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "codec_golden"

SPEECH_TEXT = "Please call Stella. Ask her to bring these things with her from the store."


@pytest.fixture(scope="session")
def codec() -> Codec:
    torch.set_num_threads(1)
    return tiny_codec(seed=0)


@pytest.fixture(scope="session")
def speech_files(tmp_path_factory) -> dict[str, Path]:
    """espeak-ng speech (22.05 kHz mono) converted by sox to 16 kHz stereo WAV and 44.1 kHz mono FLAC."""
    folder = tmp_path_factory.mktemp("speech")
    source = folder / "espeak.wav"
    subprocess.run([need_tool("espeak-ng"), "-w", str(source), SPEECH_TEXT], check=True, timeout=60)
    files = {"espeak": source, "stereo16k": folder / "stereo16k.wav", "mono44k": folder / "mono44k.flac"}
    sox = need_tool("sox")
    subprocess.run([sox, str(source), "-r", "16000", "-c", "2", str(files["stereo16k"])], check=True, timeout=60)
    subprocess.run([sox, str(source), "-r", "44100", "-c", "1", str(files["mono44k"])], check=True, timeout=60)
    return files


@pytest.fixture(scope="module")
def golden():
    """The golden fixture's arrays (tests/fixtures/codec_golden, made by scripts/make_codec_golden.py)."""
    return dict(np.load(GOLDEN / "golden.npz"))


@pytest.fixture(scope="module")
def golden_codec():
    """The golden fixture's codec, loaded by our loader."""
    torch.set_num_threads(1)
    return load_codec(GOLDEN / "audio_tokenizer", device="cpu")
