"""Reference audio at other sample rates gives exactly the reference implementation's samples and codes.

The reference (qwen-tts' tokenizer) loads a file with `librosa.load(path, sr=None, mono=True)` and resamples
it with `librosa.resample(y, orig_sr=sr, target_sr=24000)` (librosa's default, soxr at high quality). Here
librosa itself, on real speech (espeak-ng) converted by sox to 16, 22.05, 44.1 (stereo) and 48 kHz, is the
reference: our intake must give the same float32 samples, bit for bit, and so the same codes."""

from __future__ import annotations

import subprocess
import warnings

import librosa
import numpy as np
import pytest
from host_tools import need_tool

from breeze_worker.engine.reference import decode_reference_audio
from breeze_worker.model.codec.resample import resample


@pytest.fixture(scope="module")
def rates(speech_files, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rates")
    files = {"16k": folder / "16k.wav", "22k": speech_files["espeak"],
             "44k-stereo": folder / "44k-stereo.flac", "48k": folder / "48k.wav"}
    conversions = {"16k": ["-r", "16000", "-c", "1"], "44k-stereo": ["-r", "44100", "-c", "2"],
                   "48k": ["-r", "48000", "-c", "1", "-b", "24"]}
    for name, args in conversions.items():
        # a little dither per channel (sox's default) keeps the stereo channels slightly different
        subprocess.run([need_tool("sox"), str(speech_files["espeak"]), *args, str(files[name])], check=True,
                       timeout=60)
    return files


@pytest.mark.parametrize("name, rate, channels", [("16k", 16000, 1), ("22k", 22050, 1), ("44k-stereo", 44100, 2),
                                                   ("48k", 48000, 1)])
def test_samples_and_codes_equal_the_librosa_path(codec, rates, name, rate, channels):
    path = rates[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs_native, native_rate = librosa.load(path, sr=None, mono=True)
        theirs = librosa.resample(y=theirs_native, orig_sr=native_rate, target_sr=24000)
    assert native_rate == rate and theirs.dtype == np.float32
    ours, seconds = decode_reference_audio(path.read_bytes(), max_seconds=30.0)
    assert seconds == pytest.approx(len(theirs_native) / rate)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)
    ours_codes, theirs_codes = codec.encode(ours), codec.encode(theirs)
    assert ours_codes.shape[0] == -(-len(theirs) // 1920)
    np.testing.assert_array_equal(ours_codes.numpy(), theirs_codes.numpy())


@pytest.mark.parametrize("n, rate_in", [(44100, 44100), (44099, 44100), (1, 48000), (16001, 16000), (9, 22050)])
def test_lengths_are_librosas(n, rate_in):
    """The output length is librosa's ceil(N * (24000 / rate)), trimmed or zero-padded, also at the edges."""
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 0.1
    theirs = librosa.resample(y=x, orig_sr=rate_in, target_sr=24000)
    np.testing.assert_array_equal(resample(x, rate_in, 24000), theirs)
