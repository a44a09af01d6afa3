"""The HTTP face's parts without a server: the settings' checks, the comparison when the FP32 copy is off, the
streaming encoders against decoders we did not write (sox), voices."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from host_tools import need_tool

from breeze_worker.config import HttpSettings, ServerSettings, SettingsError, WorkerSettings
from breeze_worker.engine.types import ReferenceInput
from breeze_worker.transport.http import audio
from breeze_worker.transport.http.compare import Comparison
from breeze_worker.transport.http.errors import HttpError
from breeze_worker.transport.http.jobs import RecentJobs
from breeze_worker.transport.http.voices import Voices


def test_the_http_face_is_off_and_on_loopback_by_default():
    http = WorkerSettings().http
    assert http.port is None and http.host == "127.0.0.1" and not http.reference_fp32


def test_a_non_loopback_http_listener_needs_authentication():
    with pytest.raises(SettingsError, match="refusing to listen on 0.0.0.0 .*--http-host"):
        WorkerSettings(http=HttpSettings(port=8080, host="0.0.0.0")).validate()
    WorkerSettings(http=HttpSettings(port=8080, host="0.0.0.0"), server=ServerSettings(auth_token="t" * 16)).validate()
    WorkerSettings(http=HttpSettings(port=None, host="0.0.0.0")).validate()  # off: nothing listens there


def test_the_voices_directory_must_exist(tmp_path):
    with pytest.raises(SettingsError, match="--http-voices-dir"):
        WorkerSettings(http=HttpSettings(voices_dir=tmp_path / "none")).validate()


async def test_the_comparison_says_it_is_off_and_answers_501_with_the_setting():
    comparison = Comparison(WorkerSettings(), engine=None, store=None, recent=RecentJobs())
    assert comparison.describe()["enabled"] is False
    assert "--http-reference-fp32" in comparison.describe()["description"]
    with pytest.raises(HttpError) as caught:
        await comparison.compare("job-x")
    assert caught.value.status == 501 and "--http-reference-fp32" in caught.value.message
    await comparison.stop()


def sox_decode(data: bytes, kind: str) -> bytes:
    out = subprocess.run([need_tool("sox"), "-t", kind, "-", "-t", "raw", "-e", "signed", "-b", "16", "-c", "1", "-"],
                         input=data, capture_output=True, timeout=120, check=True)
    return out.stdout


PCM = (np.random.default_rng(1).standard_normal(24000) * 3000).astype("<i2").tobytes()


def streamed(fmt: str) -> bytes:
    encoder = audio.Encoder(fmt, 24000)
    return b"".join(encoder.feed(PCM[i:i + 3840]) for i in range(0, len(PCM), 3840)) + encoder.finish()


@pytest.mark.parametrize("fmt, kind", [("wav", "wav"), ("flac", "flac")])
def test_streamed_and_whole_lossless_files_decode_to_the_samples(fmt, kind):
    assert sox_decode(streamed(fmt), kind) == PCM
    assert sox_decode(audio.encode_whole(fmt, PCM, 24000), kind) == PCM


def test_a_streamed_file_differs_from_the_whole_only_in_its_late_fill_ins():
    whole, stream = audio.encode_whole("flac", PCM, 24000), streamed("flac")
    assert len(whole) == len(stream)
    assert sum(a != b for a, b in zip(whole, stream)) < 64  # STREAMINFO's length and checksum


@pytest.mark.parametrize("fmt", ["mp3", "opus"])
def test_compressed_streams_are_as_long_as_the_samples(fmt):
    if fmt not in audio.available():
        with pytest.raises(HttpError, match=f"{fmt} is not available"):
            audio.check_format(fmt)
        return
    import io

    import soundfile

    with soundfile.SoundFile(io.BytesIO(audio.encode_whole(fmt, PCM, 24000))) as f:
        assert abs(f.frames / f.samplerate - 1.0) < 0.1
    assert len(streamed(fmt)) > 1000


def test_aac_is_a_400_that_names_the_formats_there_are():
    with pytest.raises(HttpError, match="aac is not available on this worker") as caught:
        audio.check_format("aac")
    assert caught.value.status == 400 and "wav" in caught.value.message


def test_voices_map_names_to_held_references(tmp_path):
    (tmp_path / "anna.wav").write_bytes(b"RIFF....")
    (tmp_path / "anna.txt").write_text("  Her exact words.\n")
    (tmp_path / "lonely.wav").write_bytes(b"RIFF")  # no transcript: not a voice
    voices = Voices(tmp_path, max_bytes=1000)
    assert voices.names() == ["default", "anna"]
    assert voices.reference_for("anna") == ReferenceInput(audio=b"RIFF....", transcript="Her exact words.")
    assert voices.reference_for({"id": "anna"}).transcript == "Her exact words."
    assert voices.reference_for("alloy") is None and voices.reference_for("default") is None
    for bad in ("lonely", "../anna", 5):
        with pytest.raises(HttpError) as caught:
            voices.reference_for(bad)
        assert caught.value.status == 400
