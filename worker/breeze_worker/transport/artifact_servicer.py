"""The Artifacts service (its own port): Stat, Fetch (ranged, chunked, optional zstd), Delete.

File reads and compression run in a worker thread; the event loop only moves messages. The first
Fetch message is a small header: the artifact's info and the request-received, file-opened and
first-byte-sent times, with no file bytes. It is the response's first byte, so its transit measures the
path's latency and every file byte arrives in the transfer that follows (a whole first chunk would
hide up to a chunk's worth of bandwidth time in "first byte transit"). Data messages follow, each with
the time its read took and the time it was handed to gRPC, then a last message with the last-byte-sent
time (worker clock; clients map them with the Clock service). The read times tell a slow volume from a
slow path; the send times show where the worker waited on the connection. The worker's own wait for a CPU
(threadcpu) rides along: the header's over the open and since the artifact's final message, each data
message's over its read, the last message's over the whole handler, so a starved worker is not taken
for a slow volume or path.

Every message fits in 4 MiB, the default receive limit of stock gRPC clients (grpcio, grpc-js, grpc-go),
so no client needs a channel option to fetch: a data message carries at most MAX_DATA_BYTES of the file
(4 MiB - 64 KiB), compressed or not (zstd's worst case adds 1/256 plus a few bytes), and a larger
chunk_size is sent in pieces of that size.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import BinaryIO

import grpc
import zstandard

from breeze_tts_proto.v1 import artifacts_pb2, artifacts_pb2_grpc, common_pb2
from breeze_worker import threadcpu
from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.engine.types import ArtifactInfo
from breeze_worker.errors import InvalidRequest, NotFound, OutOfRange
from breeze_worker.transport.convert import artifact_to_pb
from breeze_worker.transport.status import mapped_errors

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 256 * 1024
MAX_CHUNK_BYTES = 4 * 1024 * 1024  # the largest accepted chunk_size
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # the default receive limit of stock gRPC clients
MAX_DATA_BYTES = MAX_MESSAGE_BYTES - 64 * 1024  # file bytes per message: room for zstd's worst case + framing
ZSTD_LEVEL = 3


def _read_chunk(store: ArtifactStore, fd: int, size: int, offset: int,
                compress: bool) -> tuple[bytes, int, int, int | None]:
    """(data to send, uncompressed length, ns spent reading and compressing, the thread's wait for a CPU from its
    previous task's end through the read) of `size` bytes at `offset`."""
    with threadcpu.PoolTask(quota=False) as task:  # the handler's span counts the quota's hold
        t0 = time.perf_counter_ns()
        store.storage_fault(size, write=False)  # test-only: a slow volume where no cgroup limit can throttle one
        raw = os.pread(fd, size, offset)
        data = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(raw) if compress else raw
        read_ns = time.perf_counter_ns() - t0
    return data, len(raw), read_ns, task.wait_ns


def _open(store: ArtifactStore, artifact_id: str) -> tuple[BinaryIO, ArtifactInfo, int | None]:
    """`store.open_for_read`, and the opening thread's wait for a CPU (from its previous task's end)."""
    with threadcpu.PoolTask(quota=False) as task:  # the header's span counts the quota's hold
        f, info = store.open_for_read(artifact_id)
    return f, info, task.wait_ns


@dataclass(frozen=True)
class _Cpu:
    """A Fetch's CPU evidence so far (threadcpu): what `held` read at the handler's entry, the opening thread's
    wait, and how long the worker was held between the artifact's final message and the entry."""

    entry: threadcpu.Held
    open_thread_wait: int | None
    arrival_wait: int | None

    def open_wait(self, elapsed_ns: int) -> int | None:
        """The wait from the request received to now, `elapsed_ns` later: the loop thread's and the opening
        thread's, or the CPU quota's hold on every thread when longer (a thread that waits for the interpreter
        lock held by a throttled one sleeps: only the quota shows it); at most the time that went by."""
        now = threadcpu.held()
        held = now.wait_since(self.entry)
        loop = None if now.thread is None else now.thread.wait_since(self.entry.thread)
        threads = None if loop is None or self.open_thread_wait is None else loop + self.open_thread_wait
        if held is None and threads is None:
            return None
        return min(max(held or 0, threads or 0), elapsed_ns)


def _set(message, **optional: int | None) -> None:
    """Set the optional fields whose values are known (an unknown one stays unset)."""
    for name, value in optional.items():
        if value is not None:
            setattr(message, name, value)


class ArtifactServicer(artifacts_pb2_grpc.ArtifactsServicer):
    def __init__(self, store: ArtifactStore, endpoint: str) -> None:
        self._store = store
        self._endpoint = endpoint

    async def Stat(self, request, context: grpc.aio.ServicerContext) -> common_pb2.ArtifactInfo:
        async with mapped_errors(context, f"Stat({request.artifact_id[:40]!r})"):
            info = await asyncio.to_thread(self._store.stat, request.artifact_id)
            return artifact_to_pb(info, self._endpoint)

    async def Delete(self, request, context: grpc.aio.ServicerContext) -> artifacts_pb2.DeleteArtifactResponse:
        async with mapped_errors(context, f"Delete({request.artifact_id[:40]!r})"):
            info = await asyncio.to_thread(self._store.stat, request.artifact_id)
            await asyncio.to_thread(self._store.delete, request.artifact_id)
            return artifacts_pb2.DeleteArtifactResponse(freed_bytes=info.size_bytes)

    async def Fetch(self, request, context: grpc.aio.ServicerContext) -> None:
        received_ns, cpu = time.time_ns(), threadcpu.held()  # the event loop thread's counters, the CPU quota's
        async with mapped_errors(context, f"Fetch({request.artifact_id[:40]!r})"):
            chunk = request.chunk_size or DEFAULT_CHUNK_BYTES
            if chunk > MAX_CHUNK_BYTES:
                raise InvalidRequest(f"chunk_size {chunk} is too large: use at most {MAX_CHUNK_BYTES} bytes "
                                     "(or 0 for the default)")
            if request.compression not in (artifacts_pb2.COMPRESSION_UNSPECIFIED, artifacts_pb2.COMPRESSION_NONE,
                                           artifacts_pb2.COMPRESSION_ZSTD):
                raise InvalidRequest(f"compression {request.compression} is unknown: use COMPRESSION_NONE or "
                                     "COMPRESSION_ZSTD")
            compress = request.compression == artifacts_pb2.COMPRESSION_ZSTD
            chunk = min(chunk, MAX_DATA_BYTES)
            f, info, open_wait = await asyncio.to_thread(_open, self._store, request.artifact_id)
            try:
                await self._send(context, f.fileno(), info, request, chunk, compress, received_ns,
                                 _Cpu(cpu, open_wait, threadcpu.finals.wait_since(info.artifact_id, cpu)))
            finally:
                f.close()

    async def _send(self, context, fd: int, info, request, chunk: int, compress: bool, received_ns: int,
                    cpu: _Cpu) -> None:
        size = info.size_bytes
        if request.offset > size:
            raise OutOfRange(f"offset {request.offset} is past the end of artifact {info.artifact_id} "
                             f"({size} bytes): fetch from an offset between 0 and {size}")
        end = size if request.limit == 0 else min(size, request.offset + request.limit)
        opened_ns = time.time_ns()
        delay = self._store.settings.fault_first_byte_delay_s
        if delay > 0:  # test-only fault injection (diagnosis tests)
            await asyncio.sleep(delay)
        header = artifacts_pb2.FetchArtifactResponse(offset=request.offset, uncompressed_size=0)
        header.info.CopyFrom(artifact_to_pb(info, self._endpoint))
        header.request_received_unix_ns = received_ns
        header.file_opened_unix_ns = opened_ns
        _set(header, open_cpu_wait_ns=cpu.open_wait(time.time_ns() - received_ns), arrival_cpu_wait_ns=cpu.arrival_wait)
        header.first_byte_sent_unix_ns = time.time_ns()
        await context.write(header)
        position = request.offset
        while position < end:
            n = min(chunk, end - position)
            data, raw_len, read_ns, read_wait = await asyncio.to_thread(_read_chunk, self._store, fd, n, position,
                                                                        compress)
            if raw_len != n:
                raise NotFound(f"artifact {info.artifact_id} changed while it was being sent: fetch it again")
            await context.write(artifacts_pb2.FetchArtifactResponse(data=data, offset=position,
                                                                    uncompressed_size=raw_len, read_ns=read_ns,
                                                                    read_cpu_wait_ns=read_wait,
                                                                    sent_unix_ns=time.time_ns()))
            position += raw_len
        now = threadcpu.held()
        await context.write(artifacts_pb2.FetchArtifactResponse(
            offset=position, last=True, last_byte_sent_unix_ns=time.time_ns(),
            handler_cpu_wait_ns=now.wait_since(cpu.entry),
            handler_cpu_run_ns=None if now.thread is None else now.thread.run_since(cpu.entry.thread)))
        log.info("artifact %s: sent bytes %d..%d%s", info.artifact_id, request.offset, position,
                 " (zstd)" if compress else "")
