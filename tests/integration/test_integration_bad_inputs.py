"""Every bad input gets its status and a message that says what to change; the worker keeps serving.

The oversized-request messages are checked on the raw gRPC status too: a client built from the .proto
files alone must read the same advice, not just users of the Python SDK.
"""

from __future__ import annotations

import math
import re

import grpc
import pytest
from worker_helpers import MAX_REQUEST_BYTES, assert_still_serving, tone_wav

from breeze_client.errors import InvalidArgument, NotFound, RequestTooLarge
from breeze_tts_proto.v1 import synthesis_pb2, synthesis_pb2_grpc
from breeze_worker.transport.server import receive_cap

_TONE = tone_wav(1.2)  # a reference clip: audio in every frame, not speech

CASES = {
    "empty text": (dict(text=""), "text"),
    "blank text": (dict(text="   "), "text"),
    "over-long text": (dict(text="x" * 2001), "2000"),
    "undecodable reference audio": (dict(text="Hi.", reference_audio=b"this is not audio" * 10,
                                         reference_text="words"), "reference audio could not be decoded"),
    "reference without transcript": (dict(text="Hi.", reference_audio=b"RIFF" + b"\0" * 100), "transcript"),
    "cfg_scale zero": (dict(text="Hi.", instruction="Speak softly.", cfg_scale=0.0), "cfg_scale"),
    "cfg_scale negative": (dict(text="Hi.", instruction="Speak softly.", cfg_scale=-2.0), "cfg_scale"),
    "cfg_scale NaN": (dict(text="Hi.", instruction="Speak softly.", cfg_scale=math.nan), "cfg_scale"),
    "cfg_scale unusable for the plain template": (dict(text="Hi.", cfg_scale=2.0), "cfg_scale"),
    "malformed reference id": (dict(text="Hi.", reference_id="ref-does-not-exist"), "ref-"),
    "one of the two guidance scales": (dict(text="Hi.", instruction="Speak softly.", cfg_scale_reference=1.5),
                                       "cfg_scale_reference was set without cfg_scale_instruction"),
    "two guidance scales without a reference": (dict(text="Hi.", instruction="Speak softly.", cfg_scale_reference=1.5,
                                                     cfg_scale_instruction=2.0), "add reference audio"),
    "two guidance scales beside cfg_scale": (dict(text="Hi.", instruction="Speak softly.", cfg_scale=2.0,
                                                  cfg_scale_reference=1.5, cfg_scale_instruction=2.0),
                                             "set cfg_scale alone or the two scales without it"),
    "a guidance scale out of range": (dict(text="Hi.", instruction="Speak softly.", reference_audio=_TONE,
                                           reference_text="a steady tone", cfg_scale_reference=1.5,
                                           cfg_scale_instruction=-1.0), "cfg_scale_instruction must be in [0, 100]"),
}
NOT_FOUND_CASES = {
    "unknown reference id": (dict(text="Hi.", reference_id="ref-" + "0" * 32), "reference"),
}


@pytest.mark.parametrize("case", [*CASES, *NOT_FOUND_CASES])
def test_bad_synthesis_input_gets_its_status_and_a_useful_message(client, case):
    kwargs, words = dict({**CASES, **NOT_FOUND_CASES}[case][0]), {**CASES, **NOT_FOUND_CASES}[case][1]
    text = kwargs.pop("text")
    expected = NotFound if case in NOT_FOUND_CASES else InvalidArgument
    with pytest.raises(expected) as info:
        client.synthesize(text, max_frames=2, **kwargs)
    exc = info.value
    assert words.lower() in exc.message.lower(), f"{case}: message {exc.message!r} should mention {words!r}"
    assert len(exc.message) > 20
    assert_still_serving(client)


def test_oversized_request_is_resource_exhausted_and_says_what_to_change(client):
    with pytest.raises(RequestTooLarge) as info:
        client.synthesize("Hi.", reference_audio=b"\0" * (MAX_REQUEST_BYTES + 1000), reference_text="words")
    assert info.value.code == "RESOURCE_EXHAUSTED" and "max-request-bytes" in info.value.message
    assert_still_serving(client)


def test_undecodable_reference_names_the_formats_to_send_and_no_internals(client):
    with pytest.raises(InvalidArgument) as info:
        client.synthesize("Hi.", max_frames=2, reference_audio=b"this is not audio" * 10, reference_text="words")
    message = info.value.message
    assert "could not be decoded" in message and "WAV, FLAC or OGG" in message
    assert not re.search(r" at 0x[0-9a-fA-F]+", message), message  # no Python object reprs leak out
    assert_still_serving(client)


@pytest.mark.parametrize("extra", [1000, MAX_REQUEST_BYTES // 2])
def test_oversized_request_message_comes_from_the_worker_itself(worker, client, extra):
    """A plain gRPC client (no SDK) gets RESOURCE_EXHAUSTED naming the limit and what to change."""
    request = synthesis_pb2.SynthesizeRequest(text="Hi.")
    request.reference.audio = b"\0" * (MAX_REQUEST_BYTES + extra)
    request.reference.transcript = "words"
    with grpc.insecure_channel(worker.target, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        with pytest.raises(grpc.RpcError) as info:
            list(synthesis_pb2_grpc.SynthesisStub(channel).Synthesize(request, timeout=60))
    err = info.value
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    details = err.details()
    assert f"{MAX_REQUEST_BYTES:,}" in details and f"{request.ByteSize():,}" in details, details
    for remedy in ("shorter reference", "reference_id", "--max-request-bytes"):
        assert remedy in details, (remedy, details)
    assert "larger than max" not in details  # not gRPC's bare limit
    assert_still_serving(client)


def test_a_request_past_grpcs_hard_cap_still_says_what_to_change(client):
    with pytest.raises(RequestTooLarge) as info:
        client.synthesize("Hi.", reference_audio=b"\0" * (receive_cap(MAX_REQUEST_BYTES) + 1000),
                          reference_text="words")
    assert "larger than max" in info.value.message and "shorter reference" in info.value.message
    assert_still_serving(client)


def test_a_client_built_from_the_proto_alone_reads_which_guidance_scale_is_missing(worker, client):
    """The two scales are fields of SynthesizeRequest: a plain gRPC client setting one gets INVALID_ARGUMENT
    naming the other."""
    request = synthesis_pb2.SynthesizeRequest(text="Hi.", instruction="Speak softly.", cfg_scale_instruction=2.0)
    with grpc.insecure_channel(worker.target) as channel:
        with pytest.raises(grpc.RpcError) as info:
            list(synthesis_pb2_grpc.SynthesisStub(channel).Synthesize(request, timeout=60))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "cfg_scale_instruction was set without cfg_scale_reference" in info.value.details()
    assert_still_serving(client)
