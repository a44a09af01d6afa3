"""The synchronous client: `BreezeClient` (synthesis channel + artifact channel).

    with BreezeClient("gpu-host:50051") as client:
        result = client.synthesize("Hello there.", seed=7)          # SynthesisResult (audio collected)
        for chunk in (stream := client.stream("Hello again.")):     # AudioChunk as they arrive
            play(chunk.pcm)
        fetched = client.fetch(stream.result.artifact.artifact_id, "hello.wav")   # FetchResult, sha256 checked

Errors are `breeze_client.errors.BreezeClientError` subclasses. Worker timestamps are mapped onto the
local clock by a clock exchange made once per channel (before the first timed call; `sync_clock` redoes it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from breeze_client import _convert, fleet
from breeze_client import clock as clock_exchange
from breeze_client._receive import FetchReceiver, StreamHandle, SynthesisReceiver, let_finish
from breeze_client._resume import DEFAULT_MAX_RESUMES, DEFAULT_RESUME_TIMEOUT_S, ResumePolicy
from breeze_client.channel import ConnectionOptions, fixed_stream_window, open_channel
from breeze_client.clock import ClockMapping, now_ns
from breeze_client.errors import BreezeClientError, Unavailable, from_rpc_error
from breeze_client.types import ArtifactRef, AudioChunk, FetchResult, SynthesisRequest, SynthesisResult, WorkerInfo
from breeze_tts_proto.v1 import artifacts_pb2, artifacts_pb2_grpc, clock_pb2_grpc, synthesis_pb2, synthesis_pb2_grpc

log = logging.getLogger(__name__)

HEALTH_NAMES = {v: k for k, v in health_pb2.HealthCheckResponse.ServingStatus.items()}


def make_request(text_or_request: str | SynthesisRequest, options: dict) -> SynthesisRequest:
    if isinstance(text_or_request, SynthesisRequest):
        return text_or_request if not options else SynthesisRequest(**{**text_or_request.__dict__, **options})
    return SynthesisRequest(text=text_or_request, **options)


class SynthesisStream(StreamHandle):
    """Iterate for AudioChunk as they arrive; `job` once started, `result` once the stream ended. The iteration
    ends with the final message, without waiting for the call's status behind it, so a fetch can follow at once.

    Leaving the iteration before the final message (a `break`, an exception in the loop body, the
    iterator being dropped) hangs up, so the worker cancels the job and frees its engine slot at once.
    As a context manager (`with client.stream(...) as stream:`) the call is cancelled on leaving the
    block unless the job finished.
    """

    def __iter__(self) -> Iterator[AudioChunk]:
        try:
            for msg in self._call:
                event = self._receiver.on_message(msg, now_ns())
                if isinstance(event, AudioChunk):
                    yield event
                if self._receiver.done:  # the final message is the last: the result is whole without the status
                    let_finish(self._call)
                    break
        except grpc.RpcError as err:
            raise self._error(err) from None
        finally:
            self._hang_up_unless_done()
        self._result = self._receiver.result()

    def __enter__(self) -> SynthesisStream:
        return self

    def __exit__(self, *exc) -> None:
        self._hang_up_unless_done()


class BreezeClient:
    def __init__(self, target: str | None = None, *, options: ConnectionOptions | None = None, **option_kw) -> None:
        opts = options or ConnectionOptions(**option_kw)
        self.options = opts if target is None else opts.with_target(target)
        # Synthesize is spread over every worker the target resolves to (health-checked round robin); worker
        # info, health and the clock exchange go to one worker over a plain channel, whatever its health
        self._channel = open_channel(self.options.target, self.options, balanced=True)
        self._control = open_channel(self.options.target, self.options)
        self._channel_opened_ns: dict[str, int] = {}  # artifact target -> when its channel was opened
        self._artifact_channels: dict[str, grpc.Channel] = {}
        self._clocks: dict[str, ClockMapping] = {}
        self._synthesis = synthesis_pb2_grpc.SynthesisStub(self._channel)
        self._control_synthesis = synthesis_pb2_grpc.SynthesisStub(self._control)
        self._info: WorkerInfo | None = None
        self._holders: dict[str, str] = {}  # artifact id -> the artifact address of the fleet worker holding it

    # ---- lifecycle ----
    def close(self) -> None:
        self._channel.close()
        self._control.close()
        for ch in self._artifact_channels.values():
            ch.close()

    def __enter__(self) -> BreezeClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _kw(self, timeout_s: float | None = None) -> dict:
        return self.options.call_kwargs(timeout_s)

    # ---- channels and clocks ----
    def artifact_target(self, endpoint: str | None = None) -> str:
        """--artifact-target if given, else the endpoint named by the artifact, else what the worker advertises."""
        return self.options.artifact_target or endpoint or self.worker_info().artifact_endpoint

    def _artifact_channel(self, target: str) -> grpc.Channel:
        if target not in self._artifact_channels:
            self._artifact_channels[target] = open_channel(target, self.options)
            self._channel_opened_ns[target] = now_ns()
        return self._artifact_channels[target]

    def _channel_for(self, target: str) -> grpc.Channel:
        return self._control if target == self.options.target else self._artifact_channel(target)

    def sync_clock(self, target: str | None = None, samples: int = clock_exchange.DEFAULT_SAMPLES) -> ClockMapping:
        """Measure (again) how the worker's clock at `target` maps onto ours."""
        target = target or self.options.target
        try:
            mapping = clock_exchange.exchange(clock_pb2_grpc.ClockStub(self._channel_for(target)), samples,
                                              **self._kw())
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        self._clocks[target] = mapping
        return mapping

    def clock(self, target: str | None = None) -> ClockMapping:
        target = target or self.options.target
        return self._clocks.get(target) or self.sync_clock(target)

    # ---- worker ----
    def worker_info(self, refresh: bool = False) -> WorkerInfo:
        if self._info is None or refresh:
            try:
                self._info = _convert.worker_info_from_pb(
                    self._control_synthesis.GetWorkerInfo(synthesis_pb2.GetWorkerInfoRequest(), **self._kw()))
            except grpc.RpcError as err:
                raise from_rpc_error(err) from None
        return self._info

    def health(self, service: str = "", target: str | None = None) -> str:
        """grpc.health.v1 status name ("SERVING", "NOT_SERVING", ...) of `service` at `target`."""
        stub = health_pb2_grpc.HealthStub(self._channel_for(target or self.options.target))
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), **self._kw())
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return HEALTH_NAMES.get(reply.status, str(reply.status))

    def wait_until_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.health() == "SERVING":
                    return
            except Unavailable:
                pass
            if time.monotonic() > deadline:
                raise Unavailable(f"the worker at {self.options.target} was not ready within {timeout_s:.0f} s")
            time.sleep(0.2)

    # ---- synthesis ----
    def stream(self, text: str | SynthesisRequest, *, collect_audio: bool = True, timeout_s: float | None = None,
               **options) -> SynthesisStream:
        """Start a job; iterate the returned stream for audio chunks as they are generated."""
        request = _convert.request_to_pb(make_request(text, options))
        mapping = self.clock()
        sent = now_ns()
        call = self._synthesis.Synthesize(request, **self._kw(timeout_s))
        return SynthesisStream(call, SynthesisReceiver(mapping, sent, collect_audio))

    def synthesize(self, text: str | SynthesisRequest, *, timeout_s: float | None = None,
                   **options) -> SynthesisResult:
        """Run a job to the end; the result holds all audio (PCM), the stats, the artifact and the timing."""
        with self.stream(text, timeout_s=timeout_s, **options) as stream:
            for _ in stream:
                pass
        return stream.result

    # ---- artifacts ----
    def _artifacts(self, endpoint: str | None,
                   artifact_id: str | None = None) -> tuple[str, artifacts_pb2_grpc.ArtifactsStub]:
        """The artifact address to call and its stub: --artifact-target, else `endpoint`, else (an id with a
        fleet target) the worker that holds `artifact_id`, else what the worker advertises."""
        if self.options.artifact_target or endpoint or artifact_id is None or not fleet.is_fleet(self.options.target):
            target = self.artifact_target(endpoint)
        else:
            target = self._holders.get(artifact_id) or self._find_holder(artifact_id)
            self._holders[artifact_id] = target
        return target, artifacts_pb2_grpc.ArtifactsStub(self._artifact_channel(target))

    def _find_holder(self, artifact_id: str) -> str:
        """Ask every worker the fleet target resolves to, at once, whether it holds `artifact_id` (fleet.py)."""
        workers = fleet.members(self.options)

        def ask(member: fleet.Member) -> tuple[fleet.Member, str | None | BreezeClientError]:
            try:
                with open_channel(member.address, member.options) as control:
                    info = synthesis_pb2_grpc.SynthesisStub(control).GetWorkerInfo(
                        synthesis_pb2.GetWorkerInfoRequest(), **member.options.call_kwargs())
                with open_channel(info.artifact_endpoint, member.options) as channel:
                    artifacts_pb2_grpc.ArtifactsStub(channel).Stat(
                        artifacts_pb2.StatArtifactRequest(artifact_id=artifact_id), **member.options.call_kwargs())
                return member, info.artifact_endpoint
            except grpc.RpcError as err:
                return member, None if err.code() is grpc.StatusCode.NOT_FOUND else from_rpc_error(err)

        with ThreadPoolExecutor(max_workers=min(16, len(workers)), thread_name_prefix="find-artifact") as pool:
            return fleet.find_holder(self.options.target, artifact_id, pool.map(ask, workers))

    def stat(self, artifact_id: str, endpoint: str | None = None) -> ArtifactRef:
        target, stub = self._artifacts(endpoint, artifact_id)
        try:
            reply = stub.Stat(artifacts_pb2.StatArtifactRequest(artifact_id=artifact_id), **self._kw())
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return _convert.artifact_from_pb(reply, self.clock(target))

    def delete(self, artifact_id: str, endpoint: str | None = None) -> int:
        """Delete an artifact on the worker; returns the bytes freed."""
        _, stub = self._artifacts(endpoint, artifact_id)
        try:
            return stub.Delete(artifacts_pb2.DeleteArtifactRequest(artifact_id=artifact_id), **self._kw()).freed_bytes
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def fetch(self, artifact: str | ArtifactRef, dest: str | Path | BinaryIO | None = None, *, offset: int = 0,
              limit: int = 0, chunk_size: int = 0, compression: str = "none", verify: bool = True,
              max_resumes: int = DEFAULT_MAX_RESUMES, resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S,
              endpoint: str | None = None, timeout_s: float | None = None) -> FetchResult:
        """Download an artifact (or a byte range) to `dest` (None: into FetchResult.data).

        A stream that breaks (UNAVAILABLE) is resumed from the bytes already received, after the artifact
        channel connects again: for up to `resume_timeout_s` of outage (counted again after every attempt
        that brought bytes), with at most `max_resumes` attempts in a row that bring nothing (0: never
        resume); see `breeze_client._resume`. With `offset` > 0 and a path, the bytes go after the first
        `offset` bytes already in the file (resuming an earlier download); the whole file's SHA-256 is
        verified when it is complete.
        """
        if isinstance(artifact, ArtifactRef):
            endpoint = endpoint or artifact.endpoint
            artifact = artifact.artifact_id
        target, stub = self._artifacts(endpoint, artifact)
        answered = target not in self._clocks  # the clock exchange below reaches the worker, or raises
        mapping = self.clock(target)
        receiver = FetchReceiver(artifact, dest, offset, limit, chunk_size, compression, mapping, target,
                                 fixed_stream_window(self.options), self._channel_opened_ns.get(target))
        policy = ResumePolicy(artifact, target, max_resumes, resume_timeout_s)
        try:
            while True:
                policy.attempt_started(receiver.position)
                try:
                    call = stub.Fetch(receiver.next_request(), **self._kw(timeout_s))
                    for msg in call:
                        receiver.on_message(msg, now_ns())
                        if msg.last:  # every byte is in: the file is done without waiting for the status
                            let_finish(call)
                            break
                    break
                except grpc.RpcError as err:
                    pause = policy.after_break(err, receiver.position, answered or receiver.info is not None)
                    log.warning("fetch of %s broke at byte %d (%s); resuming when %s is reachable", artifact,
                                receiver.position, err.details(), target)
                time.sleep(min(pause, max(policy.time_left_s(), 0.0)))
                self._wait_for_channel(target, policy, receiver.position)
                receiver.resumed()
            return receiver.finish(verify)
        except BreezeClientError:
            receiver.abandon()
            raise

    def _wait_for_channel(self, target: str, policy: ResumePolicy, position: int) -> None:
        """Block until the artifact channel is connected again, within the policy's time left."""
        ready = grpc.channel_ready_future(self._artifact_channel(target))
        try:
            ready.result(timeout=max(policy.time_left_s(), 0.01))
        except grpc.FutureTimeoutError:
            ready.cancel()
            raise policy.timed_out(position) from None
