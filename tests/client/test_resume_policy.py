"""The resume budget of a broken artifact download: outage time, idle attempts, growing pauses."""

from __future__ import annotations

import grpc
import pytest

from breeze_client._resume import ResumePolicy
from breeze_client.errors import NotFound, Unavailable


class _Err(grpc.RpcError):
    def __init__(self, code=grpc.StatusCode.UNAVAILABLE, details="Socket closed"):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_attempts_that_bring_bytes_never_use_up_the_budget():
    clock = _Clock()
    policy = ResumePolicy("art-x", "h:1", max_resumes=1, resume_timeout_s=5, now=clock)
    position = 0
    for _ in range(10):  # ten breaks, each after more bytes arrived, 4 s apart: always resumed at once
        policy.attempt_started(position)
        position += 1000
        clock.t += 4
        assert policy.after_break(_Err(), position, started=True) == 0.0
    assert policy.idle_resumes == 0


def test_idle_attempts_pause_longer_each_time_then_give_up():
    clock = _Clock()
    policy = ResumePolicy("art-x", "h:1", max_resumes=3, resume_timeout_s=60, now=clock)
    policy.attempt_started(0)
    assert policy.after_break(_Err(), 500, started=True) == 0.0  # the first break after bytes came in
    pauses = []
    for _ in range(3):
        policy.attempt_started(500)
        pauses.append(policy.after_break(_Err(), 500, started=True))
    assert pauses == [0.25, 0.5, 1.0]
    policy.attempt_started(500)
    with pytest.raises(Unavailable, match="4 resumed attempts in a row brought no bytes") as info:
        policy.after_break(_Err(), 500, started=True)
    assert "offset 500" in info.value.message


def test_an_outage_past_resume_timeout_gives_up_with_where_to_continue():
    clock = _Clock()
    policy = ResumePolicy("art-x", "h:1", max_resumes=100, resume_timeout_s=30, now=clock)
    policy.attempt_started(0)
    policy.after_break(_Err(), 700, started=True)
    clock.t += 29
    assert policy.time_left_s() == pytest.approx(1.0)
    clock.t += 2
    policy.attempt_started(700)
    with pytest.raises(Unavailable, match="resume_timeout_s") as info:
        policy.after_break(_Err(), 700, started=True)
    assert "offset 700" in info.value.message and "art-x" in info.value.message


@pytest.mark.parametrize("err,started,max_resumes,cls", [
    (_Err(grpc.StatusCode.NOT_FOUND, "gone"), True, 3, NotFound),  # not a broken connection
    (_Err(details="failed to connect to all addresses"), False, 3, Unavailable),  # never reached: gRPC's
    # retries already tried, report it now
    (_Err(), True, 0, Unavailable),  # resuming turned off
])
def test_what_is_not_resumed(err, started, max_resumes, cls):
    policy = ResumePolicy("art-x", "h:1", max_resumes=max_resumes)
    policy.attempt_started(0)
    with pytest.raises(cls) as info:
        policy.after_break(err, 100, started=started)
    assert info.value.message.startswith(err.details()) and "resume" not in info.value.message  # no resume advice


def test_a_break_before_the_first_message_is_resumed_unless_the_worker_was_never_reached():
    """A reset can discard the whole first message on a busy client: the stream broke, the worker was there.
    Only gRPC's own words for a worker it never reached end the fetch at once."""
    policy = ResumePolicy("art-x", "h:1")
    policy.attempt_started(0)
    assert policy.after_break(_Err(details="Stream removed (Socket closed)"), 0, started=False) == 0.0
    unreached = ResumePolicy("art-x", "h:1")
    unreached.attempt_started(0)
    refused = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused"
    with pytest.raises(Unavailable):
        unreached.after_break(_Err(details=refused), 0, started=False)
    assert ResumePolicy("art-x", "h:1").after_break(_Err(details=refused), 0, started=True) == 0.0
