"""One engine job behind an HTTP response, and the recent jobs the page and `GET /v1/jobs/{id}` look up.

`start_job` calls `Engine.synthesize` (the gRPC servicer's engine call: the same validation, admission,
queue, limits and artifact) and waits for the job's start before anything is written: a request the engine
refuses (bad input, a full queue, a draining worker) still gets its status, and the response head carries
the job and artifact ids (`X-Job-Id`, `X-Artifact-Id`, `X-Artifact-Endpoint`), so the artifact channel and
`breeze-client diagnose` apply to an HTTP job as to a gRPC one.

`StartedJob.audio` relays the rest of the events through `stream_relay.relay`, the bound gRPC streams have:
a client that reads more slowly than the job generates holds at most --max-stream-buffer-bytes here (and about
as much again in its socket, whose send buffer a streamed response bounds: app.py), then its response is cut
off (the connection is broken, never ended cleanly) and the job runs on for its artifact.
A client that hangs up cancels the job (the handler is cancelled and closing the events cancels it).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from breeze_worker.engine import types as et
from breeze_worker.transport.stream_relay import SlowReaderBounds, relay

MAX_RECENT_JOBS = 256  # jobs whose request and outcome stay known (for the page's comparison and job lookups)


@dataclass
class JobRecord:
    """What a recent HTTP job was asked and how it ended (the JSON of `GET /v1/jobs/{id}`)."""

    job_id: str
    artifact_id: str
    params: et.ResolvedRequest
    sample_rate: int
    received_ns: int
    queue_wait_s: float
    finished: et.JobFinished | None = None
    ended: str = "running"  # running | finished | failed: <why> | cancelled

    def to_json(self) -> dict:
        p = self.params
        out: dict = {"job_id": self.job_id, "artifact_id": self.artifact_id, "state": self.ended,
                     "sample_rate": self.sample_rate, "queue_wait_s": self.queue_wait_s,
                     "params": {"text": p.text, "instruction": p.instruction, "cfg_scale": p.cfg_scale, "seed": p.seed,
                                "template": p.template.value, "max_frames": p.max_frames,
                                "reference_id": p.reference.reference_id if p.reference is not None else None}}
        f = self.finished
        if f is not None:
            s = f.stats
            out["done_unix_ns"] = f.done_at_ns
            out["stats"] = {"frames": s.frames, "audio_seconds": s.audio_seconds, "wall_seconds": s.wall_seconds,
                            "rtf": s.rtf, "ttfa_s": s.ttfa_s, "end_reason": s.end_reason.value,
                            "stages": {"text_encode_s": s.stages.text_encode_s, "prefill_s": s.stages.prefill_s,
                                       "generate_s": s.stages.generate_s, "codec_s": s.stages.codec_s}}
            out["artifact"] = None if f.artifact is None else {
                "artifact_id": f.artifact.artifact_id, "size_bytes": f.artifact.size_bytes,
                "sha256": f.artifact.sha256}
            out["artifact_unavailable"] = f.artifact_unavailable
        return out


class RecentJobs:
    """The last MAX_RECENT_JOBS HTTP jobs by id (oldest forgotten first)."""

    def __init__(self, capacity: int = MAX_RECENT_JOBS) -> None:
        self._jobs: collections.OrderedDict[str, JobRecord] = collections.OrderedDict()
        self._capacity = capacity

    def add(self, record: JobRecord) -> None:
        self._jobs[record.job_id] = record
        while len(self._jobs) > self._capacity:
            self._jobs.popitem(last=False)

    def get(self, job_id: str) -> JobRecord | None:
        return self._jobs.get(job_id)


@dataclass
class StartedJob:
    """A job the engine has started (its JobStarted is in `record`); `audio` relays the rest of its events."""

    record: JobRecord
    _events: AsyncIterator
    _slow_readers: SlowReaderBounds
    _done: bool = field(default=False)

    def headers(self, artifact_endpoint: str) -> dict[str, str]:
        return {"X-Job-Id": self.record.job_id, "X-Artifact-Id": self.record.artifact_id,
                "X-Artifact-Endpoint": artifact_endpoint, "Cache-Control": "no-store"}

    async def audio(self, write: Callable[[bytes], Awaitable[None]]) -> et.JobFinished:
        """Each audio chunk's PCM through `write`, in order; returns the job's end. Raises the engine's error,
        or ResourceExhausted when the client reads too slowly (the job then runs on for its artifact)."""
        finished: list[et.JobFinished] = []

        async def deliver(event) -> None:
            if isinstance(event, et.AudioChunk):
                await write(event.pcm)
            elif isinstance(event, et.JobFinished):
                finished.append(event)

        try:
            await relay(self._events, deliver, self._slow_readers)
        except BaseException as exc:
            self.record.ended = "cancelled" if isinstance(exc, asyncio.CancelledError) else f"failed: {exc}"
            raise
        finally:
            self._done = True
        if not finished:
            raise RuntimeError(f"job {self.record.job_id} ended without its JobFinished event")
        self.record.finished = finished[0]
        self.record.ended = "finished"
        return finished[0]

    async def close(self) -> None:
        """Cancel the job if its audio was never relayed (a response that could not start)."""
        if not self._done:
            self._done = True
            await self._events.aclose()  # type: ignore[attr-defined]


async def start_job(engine, request: et.SynthesisRequest, recent: RecentJobs, *,
                    slow_readers: SlowReaderBounds, received_ns: int | None = None) -> StartedJob:
    """Submit `request` and wait for its JobStarted (queued behind other jobs as a gRPC request is); the engine's
    errors (InvalidRequest, ResourceExhausted, Unavailable, ...) are raised before anything is written."""
    received_ns = time.time_ns() if received_ns is None else received_ns
    events = engine.synthesize(request, received_ns=received_ns)
    try:
        started = await events.__anext__()
    except StopAsyncIteration:
        raise RuntimeError("the engine ended a job before starting it") from None
    except BaseException:
        await events.aclose()
        raise
    if not isinstance(started, et.JobStarted):
        await events.aclose()
        raise RuntimeError(f"expected JobStarted first, got {type(started).__name__}")
    record = JobRecord(started.job_id, started.artifact_id, started.params, started.sample_rate, received_ns,
                       started.queue_wait_s)
    recent.add(record)
    return StartedJob(record, events, slow_readers)
