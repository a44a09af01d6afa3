"""Receiving state machines shared by the sync and asyncio clients (no I/O of their own but the sink).

`SynthesisReceiver` turns Synthesize messages into typed events and, at the end, a SynthesisResult.
`FetchReceiver` writes Fetch chunks to a sink (decompressing, checking offsets, hashing) across
resumed attempts and builds the FetchResult.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import zstandard

from breeze_client import _convert, hostcpu
from breeze_client.clock import ClockMapping, now_ns
from breeze_client.errors import BreezeClientError, IntegrityError, ProtocolError, Unavailable, from_rpc_error
from breeze_client.types import (
    AudioChunk,
    ChunkTiming,
    FetchResult,
    FetchTiming,
    JobInfo,
    SynthesisResult,
    SynthesisTiming,
)
from breeze_tts_proto.v1 import artifacts_pb2, common_pb2, synthesis_pb2

if TYPE_CHECKING:
    from _hashlib import HASH


class SynthesisReceiver:
    def __init__(self, clock: ClockMapping, request_sent_ns: int, collect_audio: bool = True) -> None:
        self.clock = clock
        self.request_sent_ns = request_sent_ns
        self.collect_audio = collect_audio
        self.job: JobInfo | None = None
        self._audio = bytearray()
        self._audio_bytes = 0  # every PCM byte received, collected or not
        self._chunks = 0
        self._started_ns: int | None = None
        self._first_ns: int | None = None
        self._final_ns: int | None = None
        self._server_first: int | None = None
        self._finished: synthesis_pb2.JobFinished | None = None
        self._cpu = hostcpu.sample()  # the thread that reads the stream: its CPU wait is evidence
        self._cpu_final: hostcpu.CpuSample | None = None  # ... its counters when the final message arrived
        self._cpu_ns: tuple[int | None, int | None] = (None, None)

    def on_message(self, msg: synthesis_pb2.SynthesizeResponse, received_ns: int) -> JobInfo | AudioChunk | None:
        kind = msg.WhichOneof("event")
        if kind == "started":
            self._started_ns = received_ns
            self.job = _convert.job_from_pb(msg.started, self.clock)
            return self.job
        if kind == "chunk":
            c = msg.chunk
            if self._first_ns is None:
                self._first_ns = received_ns
                self._server_first = self.clock.to_client(c.emitted_unix_ns)
            self._chunks += 1
            self._audio_bytes += len(c.pcm)
            if self.collect_audio:
                self._audio += c.pcm
            return AudioChunk(c.sequence, c.sample_offset, c.pcm, c.num_samples,
                              self.clock.to_client(c.emitted_unix_ns), received_ns)
        if kind == "finished":
            self._final_ns = received_ns
            self._finished = msg.finished
            self._cpu_final = hostcpu.sample()
            if self._cpu is not None and self._cpu_final is not None:
                self._cpu_ns = (self._cpu_final.run_ns - self._cpu.run_ns, self._cpu_final.wait_ns - self._cpu.wait_ns)
        return None

    @property
    def done(self) -> bool:
        return self._finished is not None

    @property
    def audio_bytes(self) -> int:
        """Every PCM byte received so far."""
        return self._audio_bytes

    def result(self) -> SynthesisResult:
        if self.job is None or self._finished is None:
            raise ProtocolError("the Synthesize stream ended without its start or final message")
        f = self._finished
        artifact = _convert.artifact_from_pb(f.artifact, self.clock) if f.HasField("artifact") else None
        c = self.clock
        timing = SynthesisTiming(
            request_sent_ns=self.request_sent_ns, started_received_ns=self._started_ns,
            first_chunk_received_ns=self._first_ns, final_received_ns=self._final_ns,
            server_started_ns=self.job.server_started_ns, server_first_chunk_ns=self._server_first,
            server_done_ns=c.to_client(f.done_unix_ns),
            server_committed_ns=artifact.server_committed_ns if artifact else None,
            clock_offset_ns=c.offset_ns, clock_uncertainty_ns=c.uncertainty_ns, clock_rtt_ns=c.rtt_ns,
            cpu_run_ns=self._cpu_ns[0], cpu_wait_ns=self._cpu_ns[1], server_final_sent_ns=c.to_client(f.sent_unix_ns),
            server_notify_cpu_wait_ns=_convert.optional(f, "notify_cpu_wait_ns")["notify_cpu_wait_ns"],
            cpu_at_final=self._cpu_final)
        return SynthesisResult(job=self.job, stats=_convert.stats_from_pb(f.stats), artifact=artifact,
                               timing=timing, chunks=self._chunks, audio=bytes(self._audio),
                               audio_bytes=self._audio_bytes, artifact_unavailable=f.artifact_unavailable)


_FINISHING: set = set()  # calls read to their last message, held until their status arrives


def let_finish(call) -> None:
    """Keep a call whose last message was read until its status arrives, without waiting for it: a call dropped
    before then is cancelled, and the worker would see a hang-up on a call that succeeded."""
    _FINISHING.add(call)
    call.add_done_callback(_FINISHING.discard)


class StreamHandle:
    """What the sync and asyncio synthesis streams share: the call, its receiver and the final result."""

    def __init__(self, call, receiver: SynthesisReceiver) -> None:
        self._call = call
        self._receiver = receiver
        self._result: SynthesisResult | None = None

    def _hang_up_unless_done(self) -> None:
        if not self._receiver.done:
            self._call.cancel()

    def _error(self, err) -> BreezeClientError:
        """The SDK error for a stream that failed (`err`: grpc.RpcError). Lost after its job started (the worker
        died, drained past its grace, or the connection broke), it says what is gone and what to do."""
        error = from_rpc_error(err)
        job = self._receiver.job
        if not isinstance(error, Unavailable) or job is None or self._receiver.done:
            return error
        width = 2 if job.encoding == "s16le" else 4
        seconds = self._receiver.audio_bytes / (width * job.sample_rate) if job.sample_rate else 0.0
        gone = f"the job and its artifact {job.artifact_id} are" if job.artifact_id else "the job is"
        return Unavailable(
            f"the worker was lost while job {job.job_id} streamed ({error.message}): {gone} gone (no artifact will "
            f"be committed), and the {seconds:.1f} s of audio received are only its start. Synthesize again: a "
            "fleet target sends the job to another worker")

    @property
    def job(self):
        return self._receiver.job

    @property
    def result(self) -> SynthesisResult:
        if self._result is None:
            raise RuntimeError("the stream has not finished: iterate it to the end first")
        return self._result

    def cancel(self) -> None:
        """Hang up; the worker cancels the job and frees its slot."""
        self._call.cancel()


class FetchReceiver:
    """Writes one artifact's bytes to `dest` (a path, a binary file, or None for memory)."""

    def __init__(self, artifact_id: str, dest: str | Path | BinaryIO | None, offset: int, limit: int,
                 chunk_size: int, compression: str, clock: ClockMapping, endpoint: str,
                 stream_window_bytes: int | None = None, channel_opened_ns: int | None = None) -> None:
        if compression not in _convert.COMPRESSIONS:
            raise ValueError(f"compression must be one of {sorted(_convert.COMPRESSIONS)}, not {compression!r}")
        self.artifact_id, self.offset, self.limit = artifact_id, offset, limit
        self.chunk_size, self.compression, self.clock, self.endpoint = chunk_size, compression, clock, endpoint
        self.path: str | None = str(dest) if isinstance(dest, (str, Path)) else None
        self._owns_file = self.path is not None
        self._dest = dest
        self._file: BinaryIO | None = None  # opened at the first message: a failed call leaves no file behind
        self._hash: HASH | None = None
        self.position = offset
        self.received = self.wire = self.chunks = self.resumes = 0
        self._resuming = False  # a resumed attempt is under way and has not brought its first message yet
        self.write_ns = 0
        self.write_in_transfer_ns = 0  # write time between the first and the last byte received
        self._last_write_ns = 0  # the latest write's duration (inside the transfer once another chunk arrives)
        self.first_message_bytes = 0  # file bytes carried by the stream's first message (its header)
        self.info: common_pb2.ArtifactInfo | None = None
        self.stream_window_bytes = stream_window_bytes
        self.channel_opened_ns = channel_opened_ns  # when the artifact channel it uses was opened
        self._t: dict[str, int | None] = {k: None for k in (
            "request_sent", "received", "opened", "first_sent", "first_recv", "last_sent", "last_recv", "fsynced",
            "first_data_recv", "first_data_sent", "last_msg_recv")}
        self._chunk_times: list[ChunkTiming] = []
        self._read_ns = self._send_wait_ns = 0
        self._worker_cpu: dict[str, int | None] = {}  # the worker's CPU wait fields (first attempt's header, last's)
        self._read_cpu_wait: int | None = None  # summed over the chunks that carry it
        self._prev_sent: int | None = None  # worker send time (raw) of the attempt's previous data message
        self._cpu: hostcpu.CpuSample | None = None
        self._decompressor = zstandard.ZstdDecompressor()

    def _open(self) -> BinaryIO:
        """Open the destination (at the first message); returns it, also kept as `_file`."""
        self._hash = self._hash_prefix(self.offset)  # before the file is opened (and maybe truncated)
        dest = self._dest
        file: BinaryIO
        if dest is None:
            file = io.BytesIO()
        elif isinstance(dest, (str, Path)):  # a path: the file is ours (`self.path`)
            path = str(dest)
            resume = self.offset > 0 and os.path.exists(path)
            file = open(path, "r+b") if resume else open(path, "wb")
            if resume:  # continue right after the bytes already on disk
                file.seek(self.offset)
                file.truncate(self.offset)
        else:
            file = dest
        self._file = file
        return file

    def _hash_prefix(self, offset: int) -> HASH | None:
        """sha256 over bytes [0, offset) already in the destination file (None if they cannot be read)."""
        h = hashlib.sha256()
        if offset == 0:
            return h
        if self.path is None or not os.path.exists(self.path) or os.path.getsize(self.path) < offset:
            return None
        with open(self.path, "rb") as f:
            remaining = offset
            while remaining:
                block = f.read(min(remaining, 1 << 20))
                h.update(block)
                remaining -= len(block)
        return h

    def next_request(self) -> artifacts_pb2.FetchArtifactRequest:
        """The request for the next attempt: continue from the bytes already received."""
        if self._t["request_sent"] is None:
            self._cpu = hostcpu.sample()
            self._t["request_sent"] = now_ns()
        limit = 0 if self.limit == 0 else self.limit - (self.position - self.offset)
        return artifacts_pb2.FetchArtifactRequest(artifact_id=self.artifact_id, offset=self.position, limit=limit,
                                                  chunk_size=self.chunk_size,
                                                  compression=_convert.COMPRESSIONS[self.compression])

    def on_message(self, msg: artifacts_pb2.FetchArtifactResponse, received_ns: int) -> int:
        """Handle one message; returns the file bytes it carried."""
        if self._resuming:  # the stream continues: a resume (attempts that brought nothing are not one)
            self._resuming = False
            self.resumes += 1
        file = self._file if self._file is not None else self._open()
        if msg.HasField("info") and self.info is None:
            self.info = msg.info
            c = self.clock
            self._t["received"] = c.to_client(msg.request_received_unix_ns)
            self._t["opened"] = c.to_client(msg.file_opened_unix_ns)
            self._t["first_sent"] = c.to_client(msg.first_byte_sent_unix_ns)
            self._worker_cpu.update(_convert.optional(msg, "open_cpu_wait_ns", "arrival_cpu_wait_ns"))
            if self._t["first_recv"] is None:  # the response's first byte: the header message
                self._t["first_recv"] = received_ns
                self.first_message_bytes = msg.uncompressed_size
        if msg.last:
            self._t["last_sent"] = self.clock.to_client(msg.last_byte_sent_unix_ns)
            self._t["last_msg_recv"] = received_ns
            self._worker_cpu.update(_convert.optional(msg, "handler_cpu_wait_ns", "handler_cpu_run_ns"))
            if self._prev_sent and msg.last_byte_sent_unix_ns:  # the last data message's wait to be taken
                self._send_wait_ns += max(0, msg.last_byte_sent_unix_ns - self._prev_sent)
            # every byte is in once the stream's last message arrives: a worker slow to end the stream is in the
            # transfer, not in the client's write; the last chunk's write went by before it, inside the transfer
            self._t["last_recv"] = received_ns
            self.write_in_transfer_ns += self._last_write_ns
            self._last_write_ns = 0
            return 0
        if not msg.data and not msg.uncompressed_size:
            return 0
        if msg.offset != self.position:
            raise IntegrityError(f"chunk at offset {msg.offset} arrived where {self.position} was expected")
        data = msg.data
        if self.compression == "zstd":
            data = self._decompressor.decompress(data, max_output_size=msg.uncompressed_size)
        if len(data) != msg.uncompressed_size:
            raise IntegrityError(f"chunk at offset {msg.offset} has {len(data)} bytes, not {msg.uncompressed_size}")
        if self._t["first_recv"] is None:
            self._t["first_recv"] = received_ns
        if self._t["first_data_recv"] is None:
            self._t["first_data_recv"] = received_ns
            self._t["first_data_sent"] = self.clock.to_client(msg.sent_unix_ns)
        self._worker_chunk(msg, received_ns, len(data))
        self.write_in_transfer_ns += self._last_write_ns  # this chunk arrived after the previous write ended
        t0 = time.perf_counter_ns()
        file.write(data)
        self._last_write_ns = time.perf_counter_ns() - t0
        self.write_ns += self._last_write_ns
        if self._hash is not None:
            self._hash.update(data)
        self.position += len(data)
        self.received += len(data)
        self.wire += len(msg.data)
        self.chunks += 1
        self._t["last_recv"] = received_ns
        return len(data)

    def _worker_chunk(self, msg: artifacts_pb2.FetchArtifactResponse, received_ns: int, nbytes: int) -> None:
        """Record the chunk's timing; the gap between two sends, less the read between them, is time the
        worker's previous write waited for the connection to take it."""
        self._read_ns += msg.read_ns
        if self._prev_sent and msg.sent_unix_ns:
            self._send_wait_ns += max(0, msg.sent_unix_ns - self._prev_sent - msg.read_ns)
        self._prev_sent = msg.sent_unix_ns or None
        read_wait = msg.read_cpu_wait_ns if msg.HasField("read_cpu_wait_ns") else None
        if read_wait is not None:
            self._read_cpu_wait = (self._read_cpu_wait or 0) + read_wait
        self._chunk_times.append(ChunkTiming(received_ns, nbytes, self.clock.to_client(msg.sent_unix_ns),
                                             msg.read_ns, read_wait))

    def resumed(self) -> None:
        """A new attempt follows a break; it counts as a resume once its first message arrives."""
        self._resuming = True
        self._t["last_sent"] = None
        self._prev_sent = None

    def finish(self, verify: bool = True) -> FetchResult:
        if self.info is None or self._file is None:  # the first message opens the file
            raise ProtocolError(f"the Fetch stream of {self.artifact_id} ended without its first message")
        self._file.flush()
        if not isinstance(self._file, io.BytesIO):
            try:
                os.fsync(self._file.fileno())
            except (OSError, io.UnsupportedOperation, AttributeError, ValueError):
                pass  # a pipe or an in-memory file: nothing to sync
        complete = self.limit == 0 and self.position == self.info.size_bytes  # the whole file, from byte 0
        verified = False
        if verify and complete and self._hash is not None:  # None: the bytes before a resume could not be read
            digest = self._hash.hexdigest()
            if digest != self.info.sha256:
                self._close()
                raise IntegrityError(f"artifact {self.artifact_id}: SHA-256 {digest} of the fetched bytes does not "
                                     f"match the worker's {self.info.sha256}; fetch it again from offset 0")
            verified = True
        self._t["fsynced"] = now_ns()
        cpu_run, cpu_wait = hostcpu.since(self._cpu)
        data = self._file.getvalue() if isinstance(self._file, io.BytesIO) else None
        self._close()
        c, t = self.clock, self._t
        request_sent = t["request_sent"]
        if request_sent is None:  # stamped by next_request, which every fetch calls before its first message
            raise RuntimeError(f"the fetch of {self.artifact_id} finished without a request (call next_request)")
        timing = FetchTiming(
            request_sent_ns=request_sent, server_request_received_ns=t["received"],
            server_file_opened_ns=t["opened"], server_first_byte_sent_ns=t["first_sent"],
            first_byte_received_ns=t["first_recv"], server_last_byte_sent_ns=t["last_sent"],
            last_byte_received_ns=t["last_recv"], file_fsynced_ns=t["fsynced"], write_ns=self.write_ns,
            write_during_transfer_ns=self.write_in_transfer_ns,
            clock_offset_ns=c.offset_ns, clock_uncertainty_ns=c.uncertainty_ns, clock_rtt_ns=c.rtt_ns,
            first_data_received_ns=t["first_data_recv"], server_first_data_sent_ns=t["first_data_sent"],
            last_message_received_ns=t["last_msg_recv"], server_read_ns=self._read_ns,
            server_send_wait_ns=self._send_wait_ns, cpu_run_ns=cpu_run, cpu_wait_ns=cpu_wait,
            chunk_times=tuple(self._chunk_times), server_read_cpu_wait_ns=self._read_cpu_wait,
            cpu_at_request=self._cpu, channel_opened_ns=self.channel_opened_ns,
            clock_measured_ns=c.measured_at_ns or None,
            **{f"server_{k}": v for k, v in self._worker_cpu.items()})
        return FetchResult(
            artifact_id=self.artifact_id, path=self.path, offset=self.offset, bytes_received=self.received,
            wire_bytes=self.wire, size_bytes=self.info.size_bytes, sha256=self.info.sha256, verified=verified,
            chunks=self.chunks, chunk_size=self.chunk_size, compression=self.compression, resumes=self.resumes,
            endpoint=self.endpoint, timing=timing, data=data, first_message_bytes=self.first_message_bytes,
            stream_window_bytes=self.stream_window_bytes)

    def _close(self) -> None:
        if self._owns_file and self._file is not None:
            self._file.close()

    def abandon(self) -> None:
        self._close()
