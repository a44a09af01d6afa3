"""The Synthesize stream on the real engine (tiny default): messages, PCM = artifact, timing, clock, reference id."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
from worker_helpers import tone_wav

from breeze_client.aio import AsyncBreezeClient
from breeze_client.wav import wav_header


def _wav_data(wav: bytes, encoding: str) -> bytes:
    """The data chunk of a WAV produced by the store (header layout fixed by the encoding)."""
    header = len(wav_header(encoding, 24000, 0))
    return wav[header:]


@pytest.mark.parametrize("encoding", ["s16le", "f32le"])
def test_stream_then_artifact_is_the_same_pcm_byte_for_byte(client, encoding):
    stream = client.stream("The artifact holds what was streamed.", max_frames=8, seed=11, encoding=encoding)
    chunks = list(stream)
    result = stream.result
    job = result.job
    assert job.job_id and job.seed == 11 and job.sample_rate == 24000 and job.encoding == encoding
    assert job.template == "plain" and job.cfg_scale == 1.0 and job.queue_wait_s >= 0 and job.max_frames == 8
    assert [c.sequence for c in chunks] == list(range(len(chunks))) and chunks
    offsets = np.cumsum([0] + [c.num_samples for c in chunks])[:-1]
    assert [c.sample_offset for c in chunks] == list(offsets)
    width = 2 if encoding == "s16le" else 4
    assert all(len(c.pcm) == c.num_samples * width for c in chunks)
    pcm = b"".join(c.pcm for c in chunks)
    assert pcm == result.audio
    s = result.stats
    assert 1 <= s.frames <= 8 and s.end_reason in ("frame_limit", "end_of_speech")
    assert s.audio_seconds == pytest.approx(len(pcm) / width / 24000, rel=1e-6)
    assert s.rtf == pytest.approx(s.wall_seconds / s.audio_seconds, rel=1e-3) and s.ttfa_s > 0

    fetched = client.fetch(result.artifact)
    assert fetched.verified and fetched.size_bytes == result.artifact.size_bytes
    assert _wav_data(fetched.data, encoding) == pcm
    data, rate = sf.read(io.BytesIO(fetched.data), dtype="int16" if encoding == "s16le" else "float32")
    assert rate == 24000 and data.tobytes() == pcm


def test_timing_is_ordered_on_the_client_clock(client):
    result = client.synthesize("Timing.", max_frames=4, seed=2)
    t = result.timing
    u = t.clock_uncertainty_ns
    assert t.request_sent_ns < t.started_received_ns <= t.first_chunk_received_ns <= t.final_received_ns
    # worker events, mapped, fall inside the client's window (give or take the mapping's uncertainty)
    for server_ns in (t.server_started_ns, t.server_first_chunk_ns, t.server_done_ns, t.server_committed_ns):
        assert t.request_sent_ns - u <= server_ns <= t.final_received_ns + u
    assert t.server_started_ns <= t.server_first_chunk_ns <= t.server_done_ns <= t.server_committed_ns
    assert t.ttfa_ms is not None and t.ttfa_ms > 0


def test_clock_exchange_on_one_host_finds_no_offset(client, worker):
    for target in (worker.target, worker.artifact_target):
        mapping = client.sync_clock(target, samples=8)
        assert mapping.samples == 8 and 0 < mapping.rtt_ns < 1e9
        assert mapping.uncertainty_ns == (mapping.rtt_ns + 1) // 2
        assert abs(mapping.offset_ns) <= mapping.uncertainty_ns  # same machine, same clock: true offset is 0


def test_reference_audio_is_held_under_an_id_that_later_requests_can_name(client):
    first = client.synthesize("A voice to clone.", max_frames=16, seed=3)  # >= the 1 s reference minimum
    ref_wav = client.fetch(first.artifact).data
    cloned = client.synthesize("Same voice again.", reference_audio=ref_wav, reference_text="A voice to clone.",
                               max_frames=3, seed=4)
    ref_id = cloned.job.reference_id
    assert cloned.job.template == "clone" and ref_id and cloned.job.reference_seconds > 0
    again = client.synthesize("And once more.", reference_id=ref_id, max_frames=3, seed=5)
    assert again.job.reference_id == ref_id and again.job.template == "clone"


def test_voice_direction_with_two_guidance_scales_streams_and_reports_them(client):
    """The SDK's two keywords reach the engine; the start message reports the scales it used, the stream and
    the artifact hold the same audio."""
    stream = client.stream("Directed now.", reference_audio=tone_wav(1.2), reference_text="a steady tone",
                           instruction="calm and slow", cfg_scale_reference=1.5, cfg_scale_instruction=2.0,
                           max_frames=4, seed=6)
    chunks = list(stream)
    result = stream.result
    job = result.job
    assert job.template == "direction" and job.cfg_scale == 1.0
    assert (job.cfg_scale_reference, job.cfg_scale_instruction) == (1.5, 2.0)
    assert result.stats.frames == 4 and b"".join(c.pcm for c in chunks) == result.audio
    assert _wav_data(client.fetch(result.artifact).data, "s16le") == result.audio
    single = client.synthesize("Directed now.", reference_id=job.reference_id, instruction="calm and slow",
                               cfg_scale=2.0, max_frames=2, seed=6).job
    assert single.cfg_scale == 2.0 and single.cfg_scale_reference is None and single.cfg_scale_instruction is None


async def test_asyncio_client_streams_and_fetches(worker):
    async with AsyncBreezeClient(worker.target, timeout_s=120) as client:
        stream = await client.stream("Async.", max_frames=3, seed=9)
        chunks = [c async for c in stream]
        fetched = await client.fetch(stream.result.artifact, compression="zstd", chunk_size=4096)
        assert fetched.verified and _wav_data(fetched.data, "s16le") == b"".join(c.pcm for c in chunks)
        info = await client.worker_info()
        assert info.is_tiny_default and "NOT speech" in info.warning and info.ready
        assert info.artifact_endpoint == worker.artifact_target
