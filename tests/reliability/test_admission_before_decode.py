"""Admission before work: reference audio is decoded only once its request holds an engine slot, and its
container header is checked before anything is decoded. A real worker (one slot, one queue place) on real
ports; a hostile file (a FLAC of 8 channels at 655 350 Hz, within the duration limit)."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import soundfile as sf
from inprocess_worker import InProcessWorker
from streams import StreamInThread

from breeze_client.errors import InvalidArgument, ResourceExhausted
from breeze_client.sdk import BreezeClient
from breeze_worker.config import ArtifactSettings, EngineSettings, ServerSettings, WorkerSettings


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    settings = WorkerSettings(
        engine=EngineSettings(device="cpu", max_active_streams=1, max_queue=1),
        artifacts=ArtifactSettings(directory=tmp_path_factory.mktemp("artifacts"), min_free_bytes=0),
        server=ServerSettings(port=0, artifact_port=0),
    )
    with InProcessWorker(settings) as running:
        yield running


def _hostile_flac() -> bytes:
    """25 s of 8-channel audio at 655 350 Hz: 165 M samples to decode (1.7 GB as the old intake held them)."""
    buf = io.BytesIO()
    sf.write(buf, np.zeros((655_350 * 25, 8), dtype=np.int16), 655_350, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


def _voice(seconds: float = 2.0, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    tone = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    buf = io.BytesIO()
    sf.write(buf, tone.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _wait(predicate, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_the_hostile_flac_is_refused_from_its_header_by_a_full_worker(worker):
    hostile = _hostile_flac()
    info = sf.info(io.BytesIO(hostile))
    assert (info.channels, info.samplerate) == (8, 655_350) and info.frames / info.samplerate <= 30
    references = worker.engine.references
    scheduler = worker.engine.scheduler
    decodes = references.decodes
    with BreezeClient(worker.target, timeout_s=120) as client:
        running = StreamInThread(client, "The job that holds the only slot.", max_frames=1000, seed=1,
                                 temperature=0.0)
        running.wait_for(2)
        queued = StreamInThread(client, "The job that holds the only queue place.", max_frames=4, seed=2)
        _wait(lambda: scheduler.load() == (1, 1))  # the worker is full
        with pytest.raises(InvalidArgument, match="8 channels; at most 2"):
            client.synthesize("Clone this.", reference_audio=hostile, reference_text="Words.", max_frames=4)
        with pytest.raises(InvalidArgument, match="text is empty or only whitespace"):  # the rest of the request
            client.synthesize("", reference_audio=_voice(), reference_text="Words.", max_frames=4)  # too
        with pytest.raises(ResourceExhausted, match="queue is full"):  # a well-formed reference: no slot
            client.synthesize("Clone this.", reference_audio=_voice(), reference_text="Words.", max_frames=4)
        assert references.decodes == decodes  # nothing was decoded for either
        queued.stream.cancel()
        running.stream.cancel()
        queued.finish(), running.finish()


def test_reference_audio_is_decoded_only_once_its_job_holds_a_slot(worker):
    references = worker.engine.references
    scheduler = worker.engine.scheduler
    _wait(lambda: scheduler.load() == (0, 0))
    decodes = references.decodes
    with BreezeClient(worker.target, timeout_s=120) as client:
        running = StreamInThread(client, "The job that holds the only slot.", max_frames=1000, seed=3,
                                 temperature=0.0)
        running.wait_for(2)
        clone = StreamInThread(client, "A cloned voice, once there is room.", reference_audio=_voice(2.5),
                               reference_text="The words of the reference.", max_frames=4, seed=4)
        _wait(lambda: scheduler.load() == (1, 1))  # it waits for the slot...
        time.sleep(0.5)
        assert references.decodes == decodes and clone.job is None  # ...without its audio decoded
        running.stream.cancel()  # the slot frees
        result = clone.finish()
        assert clone.error is None and result.job.template == "clone" and result.stats.frames >= 1
        assert result.job.reference_seconds == pytest.approx(2.5)
        assert references.decodes == decodes + 1
        running.finish()


def test_header_checks_name_the_limit(worker):
    with BreezeClient(worker.target, timeout_s=120) as client:
        with pytest.raises(InvalidArgument, match="sample rate is 4000 Hz; 8000-192000 Hz"):
            client.synthesize("Too low.", reference_audio=_voice(2.0, rate=4000), reference_text="Words.",
                              max_frames=2)
        with pytest.raises(InvalidArgument, match="31.0 s long; the limit is 30 s"):
            client.synthesize("Too long.", reference_audio=_voice(31.0, rate=8000), reference_text="Words.",
                              max_frames=2)


def test_a_reference_refused_after_its_decode_gives_the_slot_back(worker):
    scheduler = worker.engine.scheduler
    _wait(lambda: scheduler.load() == (0, 0))
    buf = io.BytesIO()
    sf.write(buf, np.zeros(48000, dtype=np.float32), 24000, format="WAV", subtype="PCM_16")
    with BreezeClient(worker.target, timeout_s=120) as client:
        with pytest.raises(InvalidArgument, match="silent"):  # a sound header; only the decode tells
            client.synthesize("Silence.", reference_audio=buf.getvalue(), reference_text="Nothing.", max_frames=2)
        assert scheduler.load() == (0, 0) and scheduler.open_jobs() == 0
        assert client.synthesize("Next.", max_frames=2, seed=5).stats.frames >= 1


def test_a_caller_who_hangs_up_while_its_reference_waits_frees_its_queue_place(worker):
    scheduler = worker.engine.scheduler
    _wait(lambda: scheduler.load() == (0, 0))
    decodes = worker.engine.references.decodes
    with BreezeClient(worker.target, timeout_s=120) as client:
        running = StreamInThread(client, "The job that holds the only slot.", max_frames=1000, seed=6,
                                 temperature=0.0)
        running.wait_for(2)
        clone = StreamInThread(client, "Abandoned while waiting.", reference_audio=_voice(), max_frames=4,
                               reference_text="Words.", seed=7)
        _wait(lambda: scheduler.load() == (1, 1))
        clone.stream.cancel()
        clone.finish()
        _wait(lambda: scheduler.load() == (1, 0))  # its queue place is free at once
        running.stream.cancel()
        running.finish()
        _wait(lambda: scheduler.load() == (0, 0) and scheduler.open_jobs() == 0)
        assert worker.engine.references.decodes == decodes  # it was never decoded
        assert client.synthesize("Next.", max_frames=2, seed=8).stats.frames >= 1
