"""The OpenAI Python SDK against the served worker's HTTP face: plain requests in every format the host encodes,
streamed audio and server-sent events, voices, this worker's extra fields, and its errors as the SDK raises
them. The audio is checked against the job's artifact, fetched over the gRPC artifact channel."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import time

import numpy as np
import openai
import pytest
import requests
import soundfile
from host_tools import need_tool
from http_helpers import AUTH, TOKEN, VOICE

from breeze_client.sdk import BreezeClient

TEXT = "Hello there, one test."


@pytest.fixture(scope="module")
def sdk(served):
    with openai.OpenAI(api_key=TOKEN, base_url=served.url("/v1"), max_retries=0, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def grpc_client(served):
    with BreezeClient(served.target, token=TOKEN, timeout_s=120) as client:
        yield client


def artifact_pcm(client: BreezeClient, artifact_id: str) -> bytes:
    fetched = client.fetch(artifact_id)
    assert fetched.verified
    return fetched.data[44:]


def job_record(served, job_id: str) -> dict:
    reply = requests.get(served.url(f"/v1/jobs/{job_id}"), headers=AUTH, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def wait_for_end(served, job_id: str, timeout_s: float = 600) -> dict:
    """The job's record once it is no longer running (the condition; the timeout only bounds a hang)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = job_record(served, job_id)
        if record["state"] != "running":
            return record
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} still running after {timeout_s} s")


def test_wav_through_the_sdk_is_the_jobs_artifact(served, sdk, grpc_client):
    raw = sdk.audio.speech.with_raw_response.create(model="breeze-tts-2", voice="alloy", input=TEXT,
                                                    response_format="wav", extra_body={"seed": 11})
    assert raw.headers["content-type"] == "audio/wav"
    data = raw.content
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    assert rate == 24000 and samples.size > 0
    job_id, artifact_id = raw.headers["x-job-id"], raw.headers["x-artifact-id"]
    assert job_id.startswith("job-") and artifact_id.startswith("art-")
    assert artifact_pcm(grpc_client, artifact_id) == samples.astype("<i2").tobytes()
    record = job_record(served, job_id)
    assert record["state"] == "finished" and record["params"]["seed"] == 11
    assert record["artifact"]["artifact_id"] == artifact_id


def test_the_same_seed_gives_the_same_audio_in_every_lossless_format(sdk):
    pcm = sdk.audio.speech.create(model="m", voice="alloy", input=TEXT, response_format="pcm",
                                  extra_body={"seed": 5}).read()
    assert len(pcm) > 0 and len(pcm) % 2 == 0
    for fmt in ("wav", "flac"):
        data = sdk.audio.speech.create(model="m", voice="alloy", input=TEXT, response_format=fmt,
                                       extra_body={"seed": 5}).read()
        samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
        assert rate == 24000 and samples.astype("<i2").tobytes() == pcm, fmt


@pytest.mark.parametrize("fmt, container", [("mp3", "MP3"), ("opus", "OGG")])
def test_compressed_formats_decode_to_the_same_length(served, sdk, fmt, container):
    info = requests.get(served.url("/v1/info"), headers=AUTH, timeout=60).json()
    if fmt not in info["response_formats"]:  # the host's libsndfile lacks the encoder: a clear 400 instead
        with pytest.raises(openai.BadRequestError, match=f"{fmt} is not available on this worker"):
            sdk.audio.speech.create(model="m", voice="alloy", input=TEXT, response_format=fmt)
        return
    pcm = sdk.audio.speech.create(model="m", voice="alloy", input=TEXT, response_format="pcm",
                                  extra_body={"seed": 9}).read()
    data = sdk.audio.speech.create(model="m", voice="alloy", input=TEXT, response_format=fmt,
                                   extra_body={"seed": 9}).read()
    with soundfile.SoundFile(io.BytesIO(data)) as decoded:
        assert decoded.format == container and decoded.samplerate in (24000, 48000)
        frames = decoded.frames if decoded.frames > 0 else len(decoded.read())
        seconds = frames / decoded.samplerate
    assert abs(seconds - len(pcm) / 2 / 24000) < 0.2  # codec padding and priming only


def test_streaming_audio_arrives_while_the_job_runs(served, sdk):
    """The first chunk reaches the client while the job still generates: closing the response then cancels the
    job before its frame limit (a server that buffered the whole file could only be hung up on after the end)."""
    long_text = " ".join(["A longer passage so that the job runs for many frames."] * 6)
    with sdk.audio.speech.with_streaming_response.create(model="m", voice="alloy", input=long_text,
                                                         response_format="pcm",
                                                         extra_body={"stream": True, "seed": 3,
                                                                     "max_frames": 1200}) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        job_id = response.headers["x-job-id"]
        first = next(response.iter_bytes())
        assert first
    record = wait_for_end(served, job_id)
    assert record["state"] == "cancelled"
    # the engine frees the slot at the next frame boundary; the record is the transport's view


def test_streamed_wav_and_flac_decode_to_the_plain_audio(sdk):
    pcm = sdk.audio.speech.create(model="m", voice="alloy", input=TEXT, response_format="pcm",
                                  extra_body={"seed": 21}).read()
    for fmt in ("wav", "flac"):
        with sdk.audio.speech.with_streaming_response.create(
                model="m", voice="alloy", input=TEXT, response_format=fmt,
                extra_body={"stream": True, "seed": 21}) as response:
            chunks = list(response.iter_bytes())
        data = b"".join(chunks)
        if fmt == "wav":  # the streamed header says "length unknown"
            assert data[4:8] == b"\xff\xff\xff\xff" and data[40:44] == b"\xff\xff\xff\xff"
            assert data[44:] == pcm
        else:
            assert read_stream(data) == pcm


def read_stream(data: bytes) -> bytes:
    """A streamed FLAC's samples as sox (libFLAC) reads them: its header gives no length, which a stream may."""
    out = subprocess.run([need_tool("sox"), "-t", "flac", "-", "-t", "raw", "-e", "signed", "-b", "16", "-"],
                         input=data, capture_output=True, timeout=120, check=True)
    return out.stdout


def test_server_sent_events_carry_every_chunk_then_done(served, sdk, grpc_client):
    with sdk.audio.speech.with_streaming_response.create(model="m", voice="alloy", input=TEXT,
                                                         response_format="pcm", stream_format="sse",
                                                         extra_body={"seed": 4}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line[len("data: "):]) for line in lines]
    deltas, done = events[:-1], events[-1]
    assert {e["type"] for e in deltas} == {"speech.audio.delta"} and done["type"] == "speech.audio.done"
    assert len(deltas) == done["usage"]["frames"]  # one event per 80 ms frame, as generated
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert pcm == artifact_pcm(grpc_client, done["artifact_id"])


def test_a_voice_from_the_directory_clones_it(served, sdk):
    raw = sdk.audio.speech.with_raw_response.create(model="m", voice=VOICE, input=TEXT, response_format="pcm")
    record = job_record(served, raw.headers["x-job-id"])
    assert record["params"]["template"] == "clone" and record["params"]["reference_id"].startswith("ref-")
    by_id = sdk.audio.speech.with_raw_response.create(
        model="m", voice="alloy", input=TEXT, response_format="pcm",
        extra_body={"reference_id": record["params"]["reference_id"], "seed": record["params"]["seed"]})
    again = job_record(served, by_id.headers["x-job-id"])
    assert again["params"]["reference_id"] == record["params"]["reference_id"]
    assert by_id.content == raw.content  # the same reference, seed and text: the same audio


def test_instructions_choose_voice_design_with_guidance(served, sdk):
    raw = sdk.audio.speech.with_raw_response.create(model="m", voice="alloy", input=TEXT, response_format="pcm",
                                                    instructions="Speak slowly and warmly.",
                                                    extra_body={"cfg_scale": 2.0})
    params = job_record(served, raw.headers["x-job-id"])["params"]
    assert params["template"] == "instruction" and params["cfg_scale"] == 2.0


@pytest.mark.parametrize("kwargs, match", [
    ({"voice": "nobody"}, "unknown voice 'nobody'"),
    ({"speed": 1.5}, "speed 1.5 is not available"),
    ({"response_format": "aac"}, "aac is not available on this worker"),
    ({"extra_body": {"seed": "x"}}, "seed must be an integer"),
    ({"extra_body": {"cfg": 2}}, "unknown field"),
    ({"extra_body": {"cfg_scale": 3.0}}, "needs a negative prompt"),
    ({"input": "   "}, "text is empty"),
])
def test_bad_requests_are_400s_the_sdk_raises_with_the_message(sdk, kwargs, match):
    args = {"model": "m", "voice": "alloy", "input": TEXT, **kwargs}
    with pytest.raises(openai.BadRequestError, match=match) as caught:
        sdk.audio.speech.create(**args)
    assert caught.value.status_code == 400


def test_a_wrong_api_key_is_an_authentication_error(served):
    with openai.OpenAI(api_key="wrong", base_url=served.url("/v1"), max_retries=0) as other:
        with pytest.raises(openai.AuthenticationError, match="wrong bearer token"):
            other.audio.speech.create(model="m", voice="alloy", input=TEXT)


def test_the_pcm_is_int16_little_endian_mono(sdk):
    pcm = sdk.audio.speech.create(model="m", voice="alloy", input=TEXT, response_format="pcm",
                                  extra_body={"seed": 2}).read()
    samples = np.frombuffer(pcm, dtype="<i2")
    assert samples.size == len(pcm) // 2 and samples.size % 1920 == 0  # whole 80 ms frames at 24 kHz
