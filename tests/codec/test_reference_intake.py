"""Reference audio intake: formats, rates and channels in, 24 kHz codes out, clear refusals, one encode each."""

from __future__ import annotations

import io
import math
import threading

import numpy as np
import pytest
import soundfile

from breeze_worker.engine.reference import ReferenceStore, decode_reference_audio, reference_id
from breeze_worker.errors import InvalidRequest, NotFound
from breeze_worker.model.codec.resample import resample

TRANSCRIPT = "Please call Stella. Ask her to bring these things with her from the store."


def encode_file(samples: np.ndarray, rate: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def tone(seconds: float, rate: int, hz: float = 220.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    mono = (0.4 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
    return mono if channels == 1 else np.stack([mono] * channels, axis=1)


@pytest.fixture()
def store(codec):
    return ReferenceStore(codec, max_entries=4, max_seconds=30.0)


@pytest.mark.parametrize("name, rate, channels", [("stereo16k", 16000, 2), ("mono44k", 44100, 1)])
def test_espeak_speech_goes_through_intake_and_encoding(store, speech_files, name, rate, channels):
    data = speech_files[name].read_bytes()
    info = soundfile.info(io.BytesIO(data))
    assert (info.samplerate, info.channels) == (rate, channels)
    reference = store.intake(data, TRANSCRIPT)
    assert reference.seconds == pytest.approx(info.frames / rate)
    assert 1.0 < reference.seconds < 30.0
    assert reference.codes.dtype == np.int64
    assert reference.codes.shape == (math.ceil(reference.seconds * 24000 / 1920), 16)
    assert reference.codes.min() >= 0 and reference.codes.max() < 2048
    assert len(np.unique(reference.codes[:, 0])) > 1  # speech, not one repeated frame
    assert reference.transcript == TRANSCRIPT and reference.reference_id == reference_id(data, TRANSCRIPT)
    assert store.get(reference.reference_id) is reference


def test_same_speech_at_two_rates_resamples_to_the_same_signal(speech_files):
    stereo, _ = decode_reference_audio(speech_files["stereo16k"].read_bytes(), 30.0)
    mono, _ = decode_reference_audio(speech_files["mono44k"].read_bytes(), 30.0)
    n = min(len(stereo), len(mono))
    assert abs(len(stereo) - len(mono)) <= 2
    # both came from one 22.05 kHz recording; the 16 kHz copy lost everything above 8 kHz
    assert np.corrcoef(stereo[:n], mono[:n])[0, 1] > 0.95


def test_repeated_reference_is_encoded_once(store, codec, monkeypatch):
    calls = []
    real_encode = codec.encode
    monkeypatch.setattr(codec, "encode", lambda wav: calls.append(len(wav)) or real_encode(wav))
    data = encode_file(tone(1.0, 24000), 24000)
    first = store.intake(data, "a tone")
    second = store.intake(bytearray(data), "a tone")
    assert second is first and len(calls) == 1 and store.encodes == 1
    assert store.get(first.reference_id) is first
    other = store.intake(data, "another transcript")  # a different (audio, transcript) pair
    assert other.reference_id != first.reference_id and len(calls) == 2
    np.testing.assert_array_equal(other.codes, first.codes)


def test_concurrent_intakes_of_one_reference_encode_once(store, codec, monkeypatch):
    calls = []
    gate = threading.Event()
    real_encode = codec.encode

    def slow_encode(wav):
        calls.append(1)
        gate.wait(5)
        return real_encode(wav)

    monkeypatch.setattr(codec, "encode", slow_encode)
    data = encode_file(tone(1.0, 16000), 16000)
    results = []
    threads = [threading.Thread(target=lambda: results.append(store.intake(data, "tone"))) for _ in range(4)]
    for thread in threads:
        thread.start()
    gate.set()
    for thread in threads:
        thread.join(10)
    assert len(results) == 4 and len(calls) == 1
    assert len({r.reference_id for r in results}) == 1


def test_least_recently_used_reference_is_evicted(store):
    ids = [store.intake(encode_file(tone(1.0, 8000, hz=100 + 50 * i), 8000), f"t{i}").reference_id for i in range(5)]
    assert len(store) == 4
    with pytest.raises(NotFound, match="send the reference audio and transcript again"):
        store.get(ids[0])
    assert store.get(ids[4]).reference_id == ids[4]


@pytest.mark.parametrize(
    "fmt, subtype",
    [("WAV", "PCM_U8"), ("WAV", "PCM_16"), ("WAV", "PCM_24"), ("WAV", "PCM_32"), ("WAV", "FLOAT"),
     ("WAV", "DOUBLE"), ("FLAC", "PCM_24"), ("OGG", "VORBIS")],
)
def test_sample_formats_decode_to_the_same_signal(fmt, subtype):
    source = tone(1.0, 22050, channels=2)
    samples, seconds = decode_reference_audio(encode_file(source, 22050, fmt, subtype), 30.0)
    expected = resample(source[:, 0], 22050, 24000)
    assert samples.dtype == np.float32 and seconds == pytest.approx(1.0, abs=1e-3)
    tolerance = {"PCM_U8": 2e-2, "VORBIS": 5e-2}.get(subtype, 1e-3)
    assert len(samples) == len(expected)
    assert np.abs(samples - expected)[200:-200].max() < tolerance


@pytest.mark.parametrize(
    "make_bytes, message",
    [
        (lambda: b"", "reference audio is empty"),
        (lambda: b"this is not audio at all" * 10, "could not be decoded: send a WAV, FLAC or OGG"),
        (lambda: encode_file(np.zeros(24000, np.float32), 24000), "silent"),
        (lambda: encode_file(tone(31.0, 8000), 8000), r"31\.0 s long; the limit is 30 s: trim it"),
        (lambda: encode_file(tone(0.5, 16000), 16000, "AIFF"), "not supported: convert it to WAV, FLAC or OGG"),
        (lambda: encode_file(np.full(800, np.nan, np.float32), 16000, "WAV", "FLOAT"), "NaN or infinite"),
        (lambda: encode_file(np.zeros((0, 1), np.float32), 16000), "no samples"),
        (lambda: encode_file(np.full(1, 0.5, np.float32), 16000), r"too short \(0\.00 s.*at least 1 s of speech"),
        (lambda: encode_file(tone(0.01, 24000), 24000), r"too short \(0\.01 s.*at least 1 s of speech"),
        (lambda: encode_file(tone(2.0, 24000), 24000, "WAV", "PCM_16")[:44 + 2 * 2400], "too short"),  # truncated
        (lambda: encode_file(np.full(48000, 0.3, np.float32), 24000), "silent: only 0% of it"),  # DC offset
        (lambda: encode_file(_click_in_silence(), 24000), "silent: only 1% of it"),
        (lambda: encode_file(np.stack([tone(2.0, 16000), -tone(2.0, 16000)], axis=1), 16000),
         "channels cancel each other"),
    ],
    ids=["empty", "undecodable", "silent", "too-long", "aiff", "nan", "zero-frames", "one-sample", "10-ms",
         "truncated", "dc-offset", "one-click", "cancelling-stereo"],
)
def test_bad_audio_gets_a_clear_message(store, codec, monkeypatch, make_bytes, message):
    monkeypatch.setattr(codec, "encode", lambda wav: pytest.fail("the encoder must not run on bad input"))
    with pytest.raises(InvalidRequest, match=message):
        store.intake(make_bytes(), TRANSCRIPT)
    assert len(store) == 0


def _click_in_silence() -> np.ndarray:
    samples = np.zeros(48000, np.float32)  # 2 s of digital silence with one full-scale click
    samples[20000] = 1.0
    return samples


def test_undecodable_message_names_the_reason_not_a_python_object(store):
    with pytest.raises(InvalidRequest) as err:
        store.intake(b"this is not audio at all" * 10, TRANSCRIPT)
    message = str(err.value)
    assert "(Format not recognised.)" in message
    assert "0x" not in message and "BytesIO" not in message and "Error opening" not in message


def test_minimum_length_follows_the_store_setting(codec):
    data = encode_file(tone(1.5, 16000), 16000)
    with pytest.raises(InvalidRequest, match="send at least 2 s of speech"):
        ReferenceStore(codec, max_seconds=30.0, min_seconds=2.0).intake(data, TRANSCRIPT)
    assert ReferenceStore(codec, max_seconds=30.0, min_seconds=1.5).intake(data, TRANSCRIPT).seconds == 1.5


def test_quiet_speech_after_a_long_pause_is_not_called_silent():
    quiet = np.concatenate([np.zeros(16000, np.float32), 0.01 * tone(1.0, 16000)])  # -47 dBFS speech-level tone
    samples, seconds = decode_reference_audio(encode_file(quiet, 16000), 30.0)
    assert seconds == pytest.approx(2.0) and len(samples) == 48000


def test_bad_transcript_and_ids_get_clear_messages(store):
    with pytest.raises(InvalidRequest, match="transcript is empty"):
        store.intake(encode_file(tone(1.0, 16000), 16000), "   ")
    with pytest.raises(InvalidRequest, match="malformed: expected 'ref-' followed by 32"):
        store.get("voice-1")
    with pytest.raises(NotFound, match="not held by this worker"):
        store.get("ref-" + "0" * 32)


def test_resampler_is_accurate_and_band_limited():
    for rate in (8000, 16000, 44100, 48000, 22051):  # 22051 Hz: a ratio with no small common factor
        t = np.arange(rate) / rate
        out = resample(np.sin(2 * np.pi * 1000 * t).astype(np.float32), rate, 24000)
        assert len(out) == int(np.ceil(rate * (24000 / rate)))  # librosa's length (24001 at 44.1 kHz)
        expected = np.sin(2 * np.pi * 1000 * np.arange(len(out)) / 24000)
        assert np.abs(out - expected)[300:-300].max() < 2e-3, rate
    high = np.sin(2 * np.pi * 20000 * np.arange(48000) / 48000).astype(np.float32)
    assert np.abs(resample(high, 48000, 24000))[300:-300].max() < 1e-3  # 20 kHz must not alias to 4 kHz
