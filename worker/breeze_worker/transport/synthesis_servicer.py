"""The Synthesis service: convert the request, relay the engine's events, convert them back.

The handler writes with `context.write`, so every await of a call runs in the handler's own task:
when the caller hangs up, the CancelledError lands here and closing the engine's stream cancels the
job (its slot is freed at the next frame boundary). The events go through `stream_relay.relay`, which
bounds the audio waiting for a caller who reads more slowly than the job generates (one `SlowReaderBounds`
for every call of the server).

A request larger than `max_request_bytes` is refused here, before any conversion, with a message that
names the limit and what to change (gRPC's own receive limit sits well above it; see server.receive_cap).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc

from breeze_tts_proto.v1 import synthesis_pb2, synthesis_pb2_grpc
from breeze_worker import logs, threadcpu
from breeze_worker.engine.types import JobFinished
from breeze_worker.errors import ResourceExhausted
from breeze_worker.transport import convert
from breeze_worker.transport.status import mapped_errors
from breeze_worker.transport.stream_relay import SlowReaderBounds, relay

log = logging.getLogger(__name__)


def request_too_large(size: int, limit: int) -> ResourceExhausted:
    return ResourceExhausted(
        f"the request is {size:,} bytes; this worker accepts at most {limit:,} (its --max-request-bytes): "
        "send a shorter reference audio clip, name a reference the worker already holds with reference_id "
        "instead of re-sending the audio, or start the worker with a larger --max-request-bytes")


def _stamp_final(finished: synthesis_pb2.JobFinished, event: JobFinished) -> None:
    """The final message's send time and how long the worker was held from running since the commit ended (this,
    the event loop thread's wait for a CPU, or its CPU quota's hold on every thread); the artifact's first Fetch
    measures the same from here (threadcpu.finals)."""
    now = threadcpu.held()
    finished.sent_unix_ns = time.time_ns()
    wait = now.wait_since(event.held_at_commit)
    if wait is not None:
        finished.notify_cpu_wait_ns = wait
    if event.artifact is not None:
        threadcpu.finals.record(event.artifact.artifact_id, now)


class SynthesisServicer(synthesis_pb2_grpc.SynthesisServicer):
    def __init__(self, engine, artifact_endpoint: str, info: Callable[[], synthesis_pb2.WorkerInfo], *,
                 slow_readers: SlowReaderBounds, max_request_bytes: int | None = None) -> None:
        self._engine = engine
        self._metrics = getattr(engine, "metrics", None)  # counts the messages written (an engine double may have none)
        self._artifact_endpoint = artifact_endpoint
        self._info = info
        self._max_request_bytes = max_request_bytes
        self._slow_readers = slow_readers

    async def Synthesize(self, request: synthesis_pb2.SynthesizeRequest, context: grpc.aio.ServicerContext) -> None:
        received_ns = time.time_ns()  # JobStarted.received_unix_ns: the client's way here vs. our admission
        logs.bind(request_id=request.request_id)  # clipped and escaped: it is the client's string
        async with mapped_errors(context, "Synthesize"):
            size = request.ByteSize()
            if self._max_request_bytes is not None and size > self._max_request_bytes:
                raise request_too_large(size, self._max_request_bytes)
            engine_request = convert.synthesis_request_from_pb(request)
            events = self._engine.synthesize(engine_request, timeout_s=context.time_remaining(),
                                             received_ns=received_ns)

            async def write(event) -> None:
                message = convert.event_to_pb(event, self._artifact_endpoint)
                if isinstance(event, JobFinished):
                    _stamp_final(message.finished, event)
                await context.write(message)
                if self._metrics is not None:
                    self._metrics.message_sent()

            await relay(events, write, self._slow_readers)

    async def GetWorkerInfo(self, request, context: grpc.aio.ServicerContext) -> synthesis_pb2.WorkerInfo:
        return self._info()
