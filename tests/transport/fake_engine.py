"""An engine double for transport-only tests: the real Engine's interface, a sine wave for audio.

It writes through the real ArtifactStore, validates a little (so status mapping can be tested), and
records which jobs were cancelled (so cancellation propagation can be tested without a model).
"""

from __future__ import annotations

import asyncio
import math
import struct
import time

from breeze_worker.engine import types as et
from breeze_worker.errors import InvalidRequest


class FakeEngine:
    def __init__(self, store, frames: int = 6, samples_per_frame: int = 480, frame_delay_s: float = 0.0,
                 ready: bool = True) -> None:
        self.artifact_store = store
        self.frames, self.samples_per_frame, self.frame_delay_s = frames, samples_per_frame, frame_delay_s
        self.ready = ready
        self.is_tiny_default = True
        self.model_description = "fake engine (tests)"
        self.sample_rate = 24000
        self.active = 0
        self.cancelled: list[str] = []
        self.finished: list[str] = []
        self._n = 0

    def _pcm(self, start: int, n: int, encoding: et.PcmEncoding) -> bytes:
        xs = [0.5 * math.sin(2 * math.pi * 440 * (start + i) / self.sample_rate) for i in range(n)]
        if encoding is et.PcmEncoding.S16LE:
            return struct.pack(f"<{n}h", *(int(x * 32767) for x in xs))
        return struct.pack(f"<{n}f", *xs)

    async def synthesize(self, request: et.SynthesisRequest, *, timeout_s: float | None = None,
                         received_ns: int | None = None):
        if not request.text.strip():
            raise InvalidRequest("text is empty: send the words to speak")
        if request.cfg_scale is not None and not request.cfg_scale > 0:
            raise InvalidRequest(f"cfg_scale must be > 0, not {request.cfg_scale}")
        if request.text == "boom":
            raise RuntimeError("an unexpected bug")
        self._n += 1
        job_id = f"job-fake{self._n}"
        frames = request.max_frames or self.frames
        params = et.ResolvedRequest(text=request.text, instruction=request.instruction, cfg_scale=1.0,
                                    seed=request.seed or 1234, template=et.Template.PLAIN,
                                    sampling=et.SamplingParams(), max_frames=frames, encoding=request.encoding,
                                    frames_per_chunk=request.frames_per_chunk)
        writer = self.artifact_store.begin(job_id, self.sample_rate, request.encoding)
        self.active += 1
        committed = False
        try:
            start = time.time_ns()
            yield et.JobStarted(job_id, params, self.sample_rate, 0.0, start, received_at_ns=received_ns or start)
            offset = 0
            for i in range(frames):
                await asyncio.sleep(self.frame_delay_s)
                pcm = self._pcm(offset, self.samples_per_frame, request.encoding)
                writer.append(pcm)
                yield et.AudioChunk(i, offset, pcm, self.samples_per_frame, time.time_ns())
                offset += self.samples_per_frame
            done = time.time_ns()
            info = writer.commit()
            committed = True
            audio_s = offset / self.sample_rate
            wall = (done - start) / 1e9
            stats = et.JobStats(frames, audio_s, wall, wall / audio_s, 0.001, et.StageTimes(), et.EndReason.FRAME_LIMIT)
            self.finished.append(job_id)
            yield et.JobFinished(job_id, done, stats, info)
        finally:
            self.active -= 1
            if not committed:
                writer.abort()
                self.cancelled.append(job_id)

    async def start(self) -> None:
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
