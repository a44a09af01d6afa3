"""One synthesis job's state inside the engine: its frame source, codec stream, artifact and counters.

A `Job` lives on the engine thread once admitted. The event loop side only sees its event queue and
its `cancel()`; everything else is touched by the engine thread alone.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from breeze_worker.engine.types import (
    AudioChunk,
    EndReason,
    JobFinished,
    JobStarted,
    JobStats,
    PcmEncoding,
    ResolvedRequest,
    StageTimes,
)

if TYPE_CHECKING:
    from breeze_worker.artifacts.store import ArtifactWriter

log = logging.getLogger(__name__)

SLOT_GRANTED = "slot-granted"  # the event a job gets when a slot is reserved for it while its request is prepared


def encode_pcm(samples: np.ndarray, encoding: PcmEncoding) -> bytes:
    """Float samples in [-1, 1] -> little-endian PCM bytes (s16 rounds and clips; f32 is bit-exact). A 2-D
    array is encoded row after row (each element on its own, so a row's bytes are those of the row alone)."""
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    if encoding is PcmEncoding.F32LE:
        return samples.astype("<f4").tobytes()
    scaled = np.clip(np.round(samples * 32767.0), -32768, 32767)
    return scaled.astype("<i2").tobytes()


def bytes_per_sample(encoding: PcmEncoding) -> int:
    return 4 if encoding is PcmEncoding.F32LE else 2


def post(deliveries: list[tuple[EventSink, object]]) -> None:
    """Hand many (sink, event) pairs to their event loops with one wake-up per loop: the engine thread
    delivers a step's audio for every stream at once, and each `call_soon_threadsafe` is a write to the
    loop's wake-up pipe (and a moment the engine thread lets the loop take the interpreter lock)."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for sink, item in deliveries:
        by_loop.setdefault(sink._loop, []).append((sink._queue, item))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


def _put_all(items: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


class EventSink:
    """Delivers events from the engine thread to the asyncio consumer of one job."""

    _DONE = object()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:
        post([(self, item)])

    def close(self) -> None:
        self.put(self._DONE)

    def last(self, item) -> list[tuple[EventSink, object]]:
        """The deliveries that hand `item` and then end the stream, for `post` (many jobs' ends at once)."""
        return [(self, item), (self, self._DONE)]

    async def get(self):
        """The next event, an exception to raise, or None at the end of the stream."""
        item = await self._queue.get()
        return None if item is self._DONE else item


@dataclass
class JobTimers:
    text_encode_s: float = 0.0
    prefill_s: float = 0.0
    generate_s: float = 0.0
    codec_s: float = 0.0
    # the language model's queued work (the next frame's backbone step, ahead of the codec on one CUDA
    # stream) that the codec's wait sat through: the scheduler books it to generate_s, not codec_s
    lm_wait_s: float = 0.0


@dataclass(eq=False)  # identity semantics: a job is a dict key and a list member
class Job:
    """A request in the engine: queued, then active, then finished (or cancelled / failed)."""

    job_id: str
    params: ResolvedRequest | None  # None until a request with reference audio to decode is prepared
    sink: EventSink
    deadline: float | None  # time.monotonic() seconds, or None
    submitted_at: float = field(default_factory=time.monotonic)
    started_at: float = 0.0  # monotonic, when admitted
    started_at_ns: int = 0
    received_at_ns: int = 0  # wall clock when the request reached the worker (the transport's handler)
    first_audio_at: float | None = None
    frames: int = 0
    samples_emitted: int = 0
    chunks_emitted: int = 0
    nonfinite_events: int = 0
    nonfinite_layer: str = ""
    timers: JobTimers = field(default_factory=JobTimers)
    pending_pcm: list = field(default_factory=list)  # encoded PCM pieces not yet emitted as a chunk
    pending_samples: int = 0
    pending_frames: int = 0
    # engine-thread state, set on admission
    frames_source: object = None  # an iterator of int64 [16] frames (eager or fast path)
    artifact: ArtifactWriter | None = None
    _cancelled: threading.Event = field(default_factory=threading.Event)

    # ---- called from the event loop ----
    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline

    # ---- called from the engine thread ----
    def started_event(self, sample_rate: int) -> JobStarted:
        assert self.params is not None  # only prepared jobs are admitted
        return JobStarted(
            job_id=self.job_id,
            params=self.params,
            sample_rate=sample_rate,
            queue_wait_s=self.started_at - self.submitted_at,
            started_at_ns=self.started_at_ns,
            artifact_id=getattr(self.artifact, "artifact_id", ""),
            received_at_ns=self.received_at_ns,
        )

    def add_pcm(self, data: bytes, num_samples: int, *, flush: bool) -> AudioChunk | None:
        """Buffer one frame's PCM, already in the job's encoding (the scheduler encodes a whole codec step at
        once); return a chunk when `frames_per_chunk` frames are in, or on `flush` (no frame: `b"", 0`)."""
        params = self.params
        assert params is not None  # only prepared jobs are admitted
        if num_samples:
            self.pending_pcm.append(data)
            self.pending_samples += num_samples
            self.pending_frames += 1
        if not self.pending_pcm or (self.pending_frames < params.frames_per_chunk and not flush):
            return None
        data = self.pending_pcm[0] if len(self.pending_pcm) == 1 else b"".join(self.pending_pcm)
        num_samples = self.pending_samples
        self.pending_pcm.clear()
        self.pending_frames = self.pending_samples = 0
        if self.artifact is not None:
            self.artifact.append(data)  # the artifact holds exactly the bytes the client streams
        chunk = AudioChunk(
            sequence=self.chunks_emitted,
            sample_offset=self.samples_emitted,
            pcm=data,
            num_samples=num_samples,
            emitted_at_ns=time.time_ns(),
        )
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
        self.chunks_emitted += 1
        self.samples_emitted += num_samples
        return chunk

    def stats(self, end_reason: EndReason, sample_rate: int, done_at: float) -> JobStats:
        wall = max(done_at - self.started_at, 1e-9)
        audio = self.samples_emitted / sample_rate
        ttfa = (self.first_audio_at - self.started_at) if self.first_audio_at is not None else 0.0
        t = self.timers
        return JobStats(
            frames=self.frames,
            audio_seconds=audio,
            wall_seconds=wall,
            rtf=wall / audio if audio > 0 else float("inf"),
            ttfa_s=ttfa,
            stages=StageTimes(t.text_encode_s, t.prefill_s, t.generate_s, t.codec_s),
            end_reason=end_reason,
            nonfinite_events=self.nonfinite_events,
            nonfinite_layer=self.nonfinite_layer,
        )

    def finished_event(self, stats: JobStats, done_at_ns: int, artifact_info,
                       artifact_unavailable: str | None = None) -> JobFinished:
        return JobFinished(job_id=self.job_id, done_at_ns=done_at_ns, stats=stats, artifact=artifact_info,
                           artifact_unavailable=artifact_unavailable)
