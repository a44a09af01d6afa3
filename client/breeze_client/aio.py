"""The asyncio client: `AsyncBreezeClient`, the same API as `BreezeClient` with awaitables.

    async with AsyncBreezeClient("gpu-host:50051") as client:
        stream = await client.stream("Hello there.")
        async for chunk in stream:
            play(chunk.pcm)
        fetched = await client.fetch(stream.result.artifact, "hello.wav")
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from breeze_client import _convert, fleet
from breeze_client import clock as clock_exchange
from breeze_client._receive import FetchReceiver, StreamHandle, SynthesisReceiver, let_finish
from breeze_client._resume import DEFAULT_MAX_RESUMES, DEFAULT_RESUME_TIMEOUT_S, ResumePolicy
from breeze_client.channel import ConnectionOptions, fixed_stream_window, open_aio_channel
from breeze_client.clock import ClockMapping, now_ns
from breeze_client.errors import BreezeClientError, Unavailable, from_rpc_error
from breeze_client.sdk import HEALTH_NAMES, make_request
from breeze_client.types import ArtifactRef, AudioChunk, FetchResult, SynthesisRequest, SynthesisResult, WorkerInfo
from breeze_tts_proto.v1 import artifacts_pb2, artifacts_pb2_grpc, clock_pb2_grpc, synthesis_pb2, synthesis_pb2_grpc

log = logging.getLogger(__name__)


class AsyncSynthesisStream(StreamHandle):
    """`async for` AudioChunk as they arrive; `job` once started, `result` once the stream ended.

    Leaving the iteration before the final message hangs up (the worker cancels the job and frees its
    slot). After a `break` the event loop closes the abandoned iterator soon, not at once; use
    `async with stream:` (or `cancel()`) to hang up deterministically.
    """

    async def __aiter__(self) -> AsyncIterator[AudioChunk]:
        try:
            async for msg in self._call:
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

    async def __aenter__(self) -> AsyncSynthesisStream:
        return self

    async def __aexit__(self, *exc) -> None:
        self._hang_up_unless_done()


class AsyncBreezeClient:
    def __init__(self, target: str | None = None, *, options: ConnectionOptions | None = None, **option_kw) -> None:
        opts = options or ConnectionOptions(**option_kw)
        self.options = opts if target is None else opts.with_target(target)
        # Synthesize is spread over every worker the target resolves to (health-checked round robin); worker
        # info, health and the clock exchange go to one worker over a plain channel, whatever its health
        self._channel = open_aio_channel(self.options.target, self.options, balanced=True)
        self._control = open_aio_channel(self.options.target, self.options)
        self._channel_opened_ns: dict[str, int] = {}  # artifact target -> when its channel was opened
        self._artifact_channels: dict[str, grpc.aio.Channel] = {}
        self._clocks: dict[str, ClockMapping] = {}
        self._synthesis = synthesis_pb2_grpc.SynthesisStub(self._channel)
        self._control_synthesis = synthesis_pb2_grpc.SynthesisStub(self._control)
        self._info: WorkerInfo | None = None
        self._holders: dict[str, str] = {}  # artifact id -> the artifact address of the fleet worker holding it

    async def close(self) -> None:
        await self._channel.close()
        await self._control.close()
        for ch in self._artifact_channels.values():
            await ch.close()

    async def __aenter__(self) -> AsyncBreezeClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _kw(self, timeout_s: float | None = None) -> dict:
        return self.options.call_kwargs(timeout_s)

    # ---- channels and clocks ----
    async def artifact_target(self, endpoint: str | None = None) -> str:
        return self.options.artifact_target or endpoint or (await self.worker_info()).artifact_endpoint

    def _channel_for(self, target: str) -> grpc.aio.Channel:
        if target == self.options.target:
            return self._control
        if target not in self._artifact_channels:
            self._artifact_channels[target] = open_aio_channel(target, self.options)
            self._channel_opened_ns[target] = now_ns()
        return self._artifact_channels[target]

    async def sync_clock(self, target: str | None = None,
                         samples: int = clock_exchange.DEFAULT_SAMPLES) -> ClockMapping:
        target = target or self.options.target
        try:
            mapping = await clock_exchange.exchange_async(clock_pb2_grpc.ClockStub(self._channel_for(target)),
                                                          samples, **self._kw())
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        self._clocks[target] = mapping
        return mapping

    async def clock(self, target: str | None = None) -> ClockMapping:
        target = target or self.options.target
        return self._clocks.get(target) or await self.sync_clock(target)

    # ---- worker ----
    async def worker_info(self, refresh: bool = False) -> WorkerInfo:
        if self._info is None or refresh:
            try:
                reply = await self._control_synthesis.GetWorkerInfo(synthesis_pb2.GetWorkerInfoRequest(), **self._kw())
            except grpc.RpcError as err:
                raise from_rpc_error(err) from None
            self._info = _convert.worker_info_from_pb(reply)
        return self._info

    async def health(self, service: str = "", target: str | None = None) -> str:
        stub = health_pb2_grpc.HealthStub(self._channel_for(target or self.options.target))
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), **self._kw())
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return HEALTH_NAMES.get(reply.status, str(reply.status))

    async def wait_until_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if await self.health() == "SERVING":
                    return
            except Unavailable:
                pass
            if time.monotonic() > deadline:
                raise Unavailable(f"the worker at {self.options.target} was not ready within {timeout_s:.0f} s")
            await asyncio.sleep(0.2)

    # ---- synthesis ----
    async def stream(self, text: str | SynthesisRequest, *, collect_audio: bool = True,
                     timeout_s: float | None = None, **options) -> AsyncSynthesisStream:
        request = _convert.request_to_pb(make_request(text, options))
        mapping = await self.clock()
        sent = now_ns()
        call = self._synthesis.Synthesize(request, **self._kw(timeout_s))
        return AsyncSynthesisStream(call, SynthesisReceiver(mapping, sent, collect_audio))

    async def synthesize(self, text: str | SynthesisRequest, *, timeout_s: float | None = None,
                         **options) -> SynthesisResult:
        async with await self.stream(text, timeout_s=timeout_s, **options) as stream:
            async for _ in stream:
                pass
        return stream.result

    # ---- artifacts ----
    async def _artifacts(self, endpoint: str | None,
                         artifact_id: str | None = None) -> tuple[str, artifacts_pb2_grpc.ArtifactsStub]:
        """See BreezeClient._artifacts."""
        if self.options.artifact_target or endpoint or artifact_id is None or not fleet.is_fleet(self.options.target):
            target = await self.artifact_target(endpoint)
        else:
            target = self._holders.get(artifact_id) or await self._find_holder(artifact_id)
            self._holders[artifact_id] = target
        return target, artifacts_pb2_grpc.ArtifactsStub(self._channel_for(target))

    async def _find_holder(self, artifact_id: str) -> str:
        """See BreezeClient._find_holder."""
        workers = await asyncio.to_thread(fleet.members, self.options)  # a DNS lookup blocks

        async def ask(member: fleet.Member) -> tuple[fleet.Member, str | None | BreezeClientError]:
            try:
                async with open_aio_channel(member.address, member.options) as control:
                    info = await synthesis_pb2_grpc.SynthesisStub(control).GetWorkerInfo(
                        synthesis_pb2.GetWorkerInfoRequest(), **member.options.call_kwargs())
                async with open_aio_channel(info.artifact_endpoint, member.options) as channel:
                    await artifacts_pb2_grpc.ArtifactsStub(channel).Stat(
                        artifacts_pb2.StatArtifactRequest(artifact_id=artifact_id), **member.options.call_kwargs())
                return member, info.artifact_endpoint
            except grpc.RpcError as err:
                return member, None if err.code() is grpc.StatusCode.NOT_FOUND else from_rpc_error(err)

        answers = await asyncio.gather(*(ask(m) for m in workers))
        return fleet.find_holder(self.options.target, artifact_id, answers)

    async def stat(self, artifact_id: str, endpoint: str | None = None) -> ArtifactRef:
        target, stub = await self._artifacts(endpoint, artifact_id)
        try:
            reply = await stub.Stat(artifacts_pb2.StatArtifactRequest(artifact_id=artifact_id), **self._kw())
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return _convert.artifact_from_pb(reply, await self.clock(target))

    async def delete(self, artifact_id: str, endpoint: str | None = None) -> int:
        _, stub = await self._artifacts(endpoint, artifact_id)
        try:
            reply = await stub.Delete(artifacts_pb2.DeleteArtifactRequest(artifact_id=artifact_id), **self._kw())
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return reply.freed_bytes

    async def fetch(self, artifact: str | ArtifactRef, dest: str | Path | BinaryIO | None = None, *,
                    offset: int = 0, limit: int = 0, chunk_size: int = 0, compression: str = "none",
                    verify: bool = True, max_resumes: int = DEFAULT_MAX_RESUMES,
                    resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S, endpoint: str | None = None,
                    timeout_s: float | None = None) -> FetchResult:
        """See BreezeClient.fetch. File writes are small and sequential; they run on the event loop."""
        if isinstance(artifact, ArtifactRef):
            endpoint = endpoint or artifact.endpoint
            artifact = artifact.artifact_id
        target, stub = await self._artifacts(endpoint, artifact)
        answered = target not in self._clocks  # the clock exchange below reaches the worker, or raises
        mapping = await self.clock(target)
        receiver = FetchReceiver(artifact, dest, offset, limit, chunk_size, compression, mapping, target,
                                 fixed_stream_window(self.options), self._channel_opened_ns.get(target))
        policy = ResumePolicy(artifact, target, max_resumes, resume_timeout_s)
        try:
            while True:
                policy.attempt_started(receiver.position)
                try:
                    call = stub.Fetch(receiver.next_request(), **self._kw(timeout_s))
                    async for msg in call:
                        receiver.on_message(msg, now_ns())
                        if msg.last:  # every byte is in: the file is done without waiting for the status
                            let_finish(call)
                            break
                    break
                except grpc.RpcError as err:
                    pause = policy.after_break(err, receiver.position, answered or receiver.info is not None)
                    log.warning("fetch of %s broke at byte %d (%s); resuming when %s is reachable", artifact,
                                receiver.position, err.details(), target)
                await asyncio.sleep(min(pause, max(policy.time_left_s(), 0.0)))
                try:  # wait for the artifact channel to connect again, within the time left
                    await asyncio.wait_for(self._channel_for(target).channel_ready(),
                                           max(policy.time_left_s(), 0.01))
                except TimeoutError:
                    raise policy.timed_out(receiver.position) from None
                receiver.resumed()
            return receiver.finish(verify)
        except BreezeClientError:
            receiver.abandon()
            raise
