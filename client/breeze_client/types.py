"""Typed results of the SDK. Every timestamp is nanoseconds on the *client's* clock (`clock.now_ns`: the wall
clock as read when the SDK loaded, advanced by the monotonic clock, so a wall-clock step moves none of them).

Worker timestamps (fields named server_*) are mapped through the clock exchange; each timing record
carries the mapping's offset (worker - client) and uncertainty so a reader can judge them. Unknown
timestamps are None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from breeze_client.hostcpu import CpuSample


def _ms(a: int | None, b: int | None) -> float | None:
    return None if a is None or b is None else (b - a) / 1e6


class _Dict:
    # every subclass is a dataclass (this declares what @dataclass adds, so asdict accepts `self`)
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SynthesisRequest(_Dict):
    """What to synthesize; None means "the worker's default"."""

    text: str
    instruction: str | None = None
    cfg_scale: float | None = None
    seed: int | None = None
    reference_audio: bytes | None = None  # a whole audio file (WAV/FLAC/OGG)
    reference_text: str | None = None  # its exact transcript
    reference_id: str | None = None  # or: the id a previous job reported (JobInfo.reference_id)
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_frames: int | None = None
    encoding: str = "s16le"  # s16le | f32le
    frames_per_chunk: int = 1
    request_id: str | None = None
    # voice direction's two guidance scales (both or neither; with a reference, its transcript and an
    # instruction, and without cfg_scale): u + reference * (clone - u) + instruction * (instruction prompt - u)
    cfg_scale_reference: float | None = None
    cfg_scale_instruction: float | None = None


@dataclass(frozen=True)
class SamplingParams(_Dict):
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float


@dataclass(frozen=True)
class JobInfo(_Dict):
    """The start message: the job's id and the parameters actually used."""

    job_id: str
    template: str  # plain | instruction | clone | direction
    seed: int
    cfg_scale: float
    instruction: str
    sampling: SamplingParams
    max_frames: int
    encoding: str  # s16le | f32le
    frames_per_chunk: int
    sample_rate: int
    queue_wait_s: float
    reference_id: str  # "" without a reference; send it as reference_id next time
    reference_seconds: float
    server_started_ns: int | None  # worker's job start, mapped to the client clock
    artifact_id: str = ""  # the id the job's artifact gets once committed (fetchable after the job ends)
    artifact_endpoint: str = ""  # host:port of the Artifacts endpoint of the worker running the job (where to fetch)
    server_received_ns: int | None = None  # the request reached the worker's handler (mapped; None: not stamped)
    cfg_scale_reference: float | None = None  # the two guidance scales used (None: cfg_scale or no guidance)
    cfg_scale_instruction: float | None = None


@dataclass(frozen=True)
class AudioChunk:
    sequence: int
    sample_offset: int
    pcm: bytes
    num_samples: int
    server_emitted_ns: int | None  # worker clock, mapped
    received_ns: int  # client clock


@dataclass(frozen=True)
class StageTimes(_Dict):
    text_encode_s: float
    prefill_s: float
    generate_s: float
    codec_s: float


@dataclass(frozen=True)
class JobStats(_Dict):
    frames: int
    audio_seconds: float
    wall_seconds: float
    rtf: float  # wall / audio, lower is better
    ttfa_s: float  # worker: job start -> first chunk emitted
    stages: StageTimes
    end_reason: str  # end_of_speech | frame_limit | cancelled | error
    nonfinite_events: int  # frames recomputed at a safe precision after non-finite values (the stream went on)
    nonfinite_layer: str = ""  # where the first of them overflowed ("" when none or unknown)


@dataclass(frozen=True)
class CommitTiming(_Dict):
    """How the worker committed an artifact: its timed steps (ns) and when it began (mapped)."""

    server_started_ns: int | None  # the artifact writer took the job up (generation was done)
    bytes_synced: int  # what the syncs still had to write: the WAV's part not yet on the volume, and the sidecar
    wav_fsync_ns: int  # header write + fsync of the WAV
    hash_ns: int  # reading the WAV back for its SHA-256: the part after the fsync (it runs alongside it)
    rename_ns: int
    sidecar_fsync_ns: int  # sidecar write + fsync + rename (0 from Stat)
    dir_fsync_ns: int  # directory fsync (0 from Stat)
    # the worker's wait for a CPU (None: it cannot measure it, an older worker, or Stat)
    cpu_wait_ns: int | None = None  # over the commit (from its I/O thread's previous task's end)
    cpu_run_ns: int | None = None  # the committing thread's time on a CPU
    storage_cpu_wait_ns: int | None = None  # of cpu_wait_ns, inside the storage calls
    fsync_cpu_wait_ns: int | None = None  # of that, inside the fsyncs

    @property
    def storage_ns(self) -> int:
        """Time inside the commit's storage calls."""
        return self.wav_fsync_ns + self.hash_ns + self.rename_ns + self.sidecar_fsync_ns + self.dir_fsync_ns


@dataclass(frozen=True)
class ArtifactRef(_Dict):
    artifact_id: str
    size_bytes: int
    sha256: str
    endpoint: str  # host:port of the Artifacts endpoint holding it
    server_committed_ns: int | None  # mapped to the client clock
    commit: CommitTiming | None = None  # the commit's timed steps (None: the worker did not report them)
    clock_offset_ns: int = 0  # the mapping the server_* times were mapped with (worker - client)


@dataclass(frozen=True)
class SynthesisTiming(_Dict):
    """One Synthesize call. Client events are measured here; server_* are mapped worker events."""

    request_sent_ns: int
    started_received_ns: int | None  # the start message arrived
    first_chunk_received_ns: int | None
    final_received_ns: int | None  # the final message (with the artifact) arrived
    server_started_ns: int | None  # job start on the worker (after its queue)
    server_first_chunk_ns: int | None  # first chunk left the engine
    server_done_ns: int | None  # generation done
    server_committed_ns: int | None  # artifact committed (fsync + rename)
    clock_offset_ns: int  # worker clock - client clock
    clock_uncertainty_ns: int  # +- on every server_* value
    clock_rtt_ns: int
    audio_written_ns: int | None = None  # the caller's own output file was complete (CLI -o)
    cpu_wait_ns: int | None = None  # the receiving thread's wait for a CPU during the call (hostcpu)
    cpu_run_ns: int | None = None  # its time on a CPU during the call
    server_final_sent_ns: int | None = None  # the final message was handed to gRPC on the worker (mapped)
    cpu_at_final: CpuSample | None = None  # the receiving thread's CPU counters when the final message arrived
    server_notify_cpu_wait_ns: int | None = None  # the worker's wait for a CPU from the commit to then

    @property
    def ttfa_ms(self) -> float | None:
        """Client-side time to first audio: request sent -> first chunk received."""
        return _ms(self.request_sent_ns, self.first_chunk_received_ns)

    @property
    def total_ms(self) -> float | None:
        return _ms(self.request_sent_ns, self.final_received_ns)


@dataclass(frozen=True)
class SynthesisResult(_Dict):
    job: JobInfo
    stats: JobStats
    artifact: ArtifactRef | None
    timing: SynthesisTiming
    chunks: int
    audio: bytes = field(default=b"", repr=False)  # the streamed PCM (empty if not collected)
    audio_bytes: int = 0  # PCM bytes streamed, whether or not `audio` collected them
    artifact_unavailable: str = ""  # why `artifact` is None although the audio streamed to the end

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("audio")
        d["timing"]["ttfa_ms"] = self.timing.ttfa_ms
        return d


@dataclass(frozen=True)
class ChunkTiming(_Dict):
    """One data message of a Fetch: when it arrived, what it carried, when the worker read and sent it."""

    received_ns: int  # client clock
    file_bytes: int
    server_sent_ns: int | None  # handed to gRPC on the worker (mapped)
    server_read_ns: int  # the worker's read (and compression) time for it
    server_read_cpu_wait_ns: int | None = None  # the worker's wait for a CPU in that read (None: unknown)


@dataclass(frozen=True)
class FetchTiming(_Dict):
    """One Fetch (all attempts, if it resumed). Client events measured here; server_* mapped."""

    request_sent_ns: int  # the first attempt's request
    server_request_received_ns: int | None
    server_file_opened_ns: int | None
    server_first_byte_sent_ns: int | None
    first_byte_received_ns: int | None
    server_last_byte_sent_ns: int | None  # of the last attempt
    last_byte_received_ns: int | None  # every byte is in: the stream's last message (or, without one, last chunk)
    file_fsynced_ns: int | None  # written, flushed, fsynced (and verified) on disk
    write_ns: int  # time spent inside write calls while receiving (a slow disk shows here)
    clock_offset_ns: int
    clock_uncertainty_ns: int
    clock_rtt_ns: int
    write_during_transfer_ns: int = 0  # the part of write_ns spent between first and last byte received
    first_data_received_ns: int | None = None  # the first message with file bytes arrived
    server_first_data_sent_ns: int | None = None  # ... was handed to gRPC on the worker (mapped)
    last_message_received_ns: int | None = None  # the stream's `last` message arrived
    server_read_ns: int = 0  # worker time reading (and compressing) the chunks, all attempts
    server_send_wait_ns: int = 0  # worker time waiting on the connection to take the chunks
    cpu_wait_ns: int | None = None  # the receiving thread's wait for a CPU during the fetch (hostcpu)
    cpu_run_ns: int | None = None  # its time on a CPU during the fetch
    chunk_times: tuple[ChunkTiming, ...] = ()  # one per data message received
    # the worker's wait for a CPU (threadcpu on the worker; None where it cannot measure it), first attempt:
    server_open_cpu_wait_ns: int | None = None  # request received -> header sent
    server_arrival_cpu_wait_ns: int | None = None  # the job's final message sent -> request received
    server_read_cpu_wait_ns: int | None = None  # inside the chunks' reads, all attempts
    server_handler_cpu_wait_ns: int | None = None  # the handler's event loop: request received -> last byte sent
    server_handler_cpu_run_ns: int | None = None  # its time on a CPU over the same span
    cpu_at_request: CpuSample | None = None  # the receiving thread's CPU counters when the request was sent
    channel_opened_ns: int | None = None  # when the artifact channel it used was opened (client clock)
    clock_measured_ns: int | None = None  # when that channel's clock mapping was measured (client clock)

    @property
    def transfer_ms(self) -> float | None:
        """The transfer span (first byte -> last byte received), write time included; see FetchResult.mb_per_s."""
        return _ms(self.first_byte_received_ns, self.last_byte_received_ns)


@dataclass(frozen=True)
class FetchResult(_Dict):
    artifact_id: str
    path: str | None  # where the bytes were written (None: kept in `data`)
    offset: int  # first byte fetched
    bytes_received: int  # file bytes received (uncompressed), all attempts
    wire_bytes: int  # payload bytes received (compressed size with zstd)
    size_bytes: int  # the whole artifact's size
    sha256: str  # the artifact's SHA-256 (as the worker reports it)
    verified: bool  # True: the complete file's SHA-256 was checked and matches
    chunks: int
    chunk_size: int
    compression: str
    resumes: int  # how many times the stream broke and then went on (attempts that brought nothing not counted)
    endpoint: str
    timing: FetchTiming
    data: bytes | None = field(default=None, repr=False)
    first_message_bytes: int = 0  # file bytes in the stream's first message (0: a header without data)
    stream_window_bytes: int | None = None  # the channel's fixed HTTP/2 stream window (None: BDP probing)

    def timeline(self, label: str | None = None):
        """This fetch as a `phases.Timeline` (the fetch's own events; worker times on this channel's mapping)."""
        from breeze_client.phases import map_timeline  # phases imports nothing from here

        t = self.timing
        client = {"request_sent": t.request_sent_ns, "first_byte_received": t.first_byte_received_ns,
                  "last_byte_received": t.last_byte_received_ns, "file_fsynced": t.file_fsynced_ns}
        server = {"request_received": t.server_request_received_ns, "first_byte_sent": t.server_first_byte_sent_ns}
        # the server_* fields are already mapped: undo the offset so map_timeline applies it once
        raw_server = {k: v + t.clock_offset_ns for k, v in server.items() if v}
        return map_timeline(label or self.artifact_id, {k: v for k, v in client.items() if v}, raw_server,
                            offset_ns=t.clock_offset_ns, uncertainty_ns=t.clock_uncertainty_ns,
                            file_bytes=self.bytes_received, wire_bytes=self.wire_bytes, chunk_size=self.chunk_size,
                            chunks=self.chunks, compression=self.compression, rtt_ns=t.clock_rtt_ns or None,
                            resumes=self.resumes, write_during_transfer_ns=t.write_during_transfer_ns,
                            first_chunk_bytes=self.first_message_bytes)

    @property
    def mb_per_s(self) -> float | None:
        """File MB/s over the transfer phase: the phase model's definition (`phases.transfer_rate`)."""
        from breeze_client.phases import transfer_rate

        rate = transfer_rate(self.timeline())
        return None if rate is None else rate / 1e6

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("data")
        d["mb_per_s"] = self.mb_per_s
        return d


@dataclass(frozen=True)
class WorkerInfo(_Dict):
    model_description: str
    is_tiny_default: bool
    warning: str
    sample_rate: int
    artifact_endpoint: str
    ready: bool
    max_text_chars: int
    max_request_bytes: int
    version: str
    artifact_store_degraded: str = ""  # why the worker's artifact store cannot write ("" while it can)
    artifact_disk_free_bytes: int = 0
    max_active_streams: int = 0  # streams the worker is configured to decode at once (0: an older worker)
    ready_streams: int = 0  # streams it admits now (fewer while its start-up builds the rest)
    startup_building: str = ""  # what its start-up is building now ("" once everything is built)
