"""Every bad input gets its status and a message that says what to change; the worker keeps serving."""

from __future__ import annotations

import math

import pytest

from breeze_client.errors import InvalidArgument, NotFound, RequestTooLarge
from worker_helpers import MAX_REQUEST_BYTES, assert_still_serving

CASES = {
    "empty text": (dict(text=""), "text"),
    "blank text": (dict(text="   "), "text"),
    "over-long text": (dict(text="x" * 2001), "2000"),
    "undecodable reference audio": (dict(text="Hi.", reference_audio=b"this is not audio" * 10,
                                         reference_text="words"), "audio"),
    "reference without transcript": (dict(text="Hi.", reference_audio=b"RIFF" + b"\0" * 100), "transcript"),
    "cfg_scale zero": (dict(text="Hi.", instruction="Speak softly.", cfg_scale=0.0), "cfg_scale"),
    "cfg_scale negative": (dict(text="Hi.", instruction="Speak softly.", cfg_scale=-2.0), "cfg_scale"),
    "cfg_scale NaN": (dict(text="Hi.", instruction="Speak softly.", cfg_scale=math.nan), "cfg_scale"),
    "cfg_scale unusable for the plain template": (dict(text="Hi.", cfg_scale=2.0), "cfg_scale"),
    "malformed reference id": (dict(text="Hi.", reference_id="ref-does-not-exist"), "ref-"),
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
