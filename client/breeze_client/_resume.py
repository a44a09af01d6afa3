"""When a broken artifact download is resumed, and when it gives up (shared by the sync and asyncio clients).

A Fetch stream that breaks with UNAVAILABLE after it started is resumed from the bytes already
received. Before each resumed attempt the client waits for the artifact channel to connect again, so
an outage of several seconds costs one resume, not a burst of failed calls. The budget:

- `resume_timeout_s`: how long the endpoint may stay unusable, counted from the last break after
  which bytes had come in. Each attempt that brings bytes starts the clock again.
- `max_resumes`: how many resumed attempts in a row may bring no bytes at all (0 turns resuming off).
  Such attempts are spaced by a growing pause (0.25 s, 0.5 s, 1 s, ... up to 4 s).

A Fetch that could not reach the worker at all is not resumed: gRPC's own retry policy for Fetch has already
tried, and the caller should hear about it at once. A Fetch reached the worker when the worker answered the
clock exchange made for it just before (a fetch from an endpoint this client had not used yet), when it got its
first message, or when gRPC's failure is not one of connecting or resolving. Such a Fetch is resumed even if it
broke before its first message reached the client: a connection reset discards what the kernel had received
and gRPC had not yet read, so on a busy machine a break can come before any message was handed over, although
the worker was serving.

`FetchResult.resumes` counts the attempts after a break that brought the stream back (their first message
arrived); an attempt that failed at once, on a connection already gone, is not a resume (`max_resumes`
bounds those).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from breeze_client.errors import BreezeClientError, Unavailable, from_rpc_error

DEFAULT_MAX_RESUMES = 3
DEFAULT_RESUME_TIMEOUT_S = 30.0
FIRST_PAUSE_S = 0.25
MAX_PAUSE_S = 4.0


# how gRPC says a call never reached a worker (as opposed to a stream that broke on the way)
_UNREACHED = ("failed to connect", "dns resolution failed", "name resolution")


def _unreached(details: str | None) -> bool:
    return any(words in (details or "").lower() for words in _UNREACHED)


class ResumePolicy:
    """Tracks one fetch's broken attempts; `after_break` says how long to pause, or raises to give up."""

    def __init__(self, artifact_id: str, endpoint: str, max_resumes: int = DEFAULT_MAX_RESUMES,
                 resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.artifact_id, self.endpoint = artifact_id, endpoint
        self.max_resumes, self.resume_timeout_s = max_resumes, resume_timeout_s
        self._now = now
        self._attempt_position = 0
        self._outage_since: float | None = None
        self.idle_resumes = 0  # resumed attempts in a row that brought no bytes

    def attempt_started(self, position: int) -> None:
        self._attempt_position = position

    def after_break(self, err: grpc.RpcError, position: int, started: bool) -> float:
        """The pause (seconds) before waiting for the endpoint again; raises the SDK error to give up.

        `position` is the next byte wanted; `started` whether the worker was reached: it answered the clock
        exchange made for this fetch, or an attempt got the stream's first message (without either, a failure that
        says the worker was never reached is not resumed).
        """
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = err.details() if hasattr(err, "details") else str(err)
        if code is not grpc.StatusCode.UNAVAILABLE or self.max_resumes <= 0 or (not started and _unreached(details)):
            raise from_rpc_error(err) from None
        now = self._now()
        if self._outage_since is None or position > self._attempt_position:
            self._outage_since, self.idle_resumes = now, 0  # bytes came in: a fresh budget
        else:
            self.idle_resumes += 1
        if self.idle_resumes > self.max_resumes:
            raise self._give_up(position, f"{self.idle_resumes} resumed attempts in a row brought no bytes "
                                          f"(last: {details})") from None
        if self.time_left_s() <= 0:
            raise self.timed_out(position, details) from None
        return 0.0 if self.idle_resumes == 0 else min(FIRST_PAUSE_S * 2 ** (self.idle_resumes - 1), MAX_PAUSE_S)

    def time_left_s(self) -> float:
        if self._outage_since is None:
            return self.resume_timeout_s
        return self.resume_timeout_s - (self._now() - self._outage_since)

    def timed_out(self, position: int, details: str = "") -> BreezeClientError:
        why = f"the endpoint stayed unusable for {self.resume_timeout_s:.0f} s (resume_timeout_s)"
        return self._give_up(position, f"{why}{f'; last: {details}' if details else ''}")

    def _give_up(self, position: int, why: str) -> BreezeClientError:
        return Unavailable(
            f"the fetch of {self.artifact_id} from {self.endpoint} broke at byte {position} and could not be "
            f"resumed: {why}. The bytes received so far are kept: fetch again from offset {position} "
            "(breeze-client fetch --resume) once the artifact endpoint is reachable")
