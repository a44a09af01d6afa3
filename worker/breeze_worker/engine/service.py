"""The engine as the transport sees it: `start`, `synthesize` (an async stream of events), `stop`.

Request lifecycle: validate and resolve the request, admit it into the scheduler's queue, then relay the
engine thread's events. Closing the stream early (the caller hung up, or its task was cancelled) cancels
the job; the engine thread frees its slot at the next frame boundary and discards its unfinished artifact.

New reference audio is work, so it waits for a slot: its container header and the rest of the request are
checked first (cheap; a stand-in of the header's length takes the reference's place in the prompt), the
job queues (or is refused) like any other, and only once the scheduler reserves it a slot is the audio
decoded and encoded, in a thread. A reference already held (same audio and transcript) needs no decode.

`drain` (SIGTERM) refuses new requests with UNAVAILABLE, ends the queued ones, and waits for the running.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import numpy as np

from breeze_worker import logs
from breeze_worker.config import EngineSettings
from breeze_worker.engine.metrics import EngineMetrics
from breeze_worker.engine.session import SLOT_GRANTED, EventSink, Job
from breeze_worker.engine.types import ResolvedReference, ResolvedRequest, SynthesisRequest
from breeze_worker.errors import InvalidRequest, Unavailable

if TYPE_CHECKING:
    from breeze_worker.engine.reference import ReferenceStore
    from breeze_worker.engine.runtime import Runtime
    from breeze_worker.engine.scheduler import Scheduler

log = logging.getLogger(__name__)


def new_job_id() -> str:
    return "job-" + secrets.token_hex(12)


class Engine:
    def __init__(self, settings: EngineSettings, artifact_store):
        settings.validate()
        self.settings = settings
        self.artifact_store = artifact_store
        # set by `_load` (in `start`), before `ready`
        self.runtime: Runtime | None = None
        self.references: ReferenceStore | None = None
        self.scheduler: Scheduler | None = None
        self.ready = False
        self.draining = False
        self.load_s = 0.0
        self.metrics = EngineMetrics(artifact_status=getattr(artifact_store, "status", None), readiness=self.readiness)

    # ---- lifecycle ----
    async def start(self) -> None:
        """Load and warm the model off the event loop; afterwards `ready` is True."""
        t0 = time.perf_counter()
        await asyncio.to_thread(self._load)
        self.load_s = time.perf_counter() - t0
        assert self.scheduler is not None and self.runtime is not None  # `_load` made them
        self.scheduler.start()
        self.ready = True
        self.runtime.start_background(on_progress=self._startup_progress)
        if self.not_speech_warning:
            log.warning("%s", self.not_speech_warning)
        ready = self.runtime.ready_streams
        log.info("engine ready in %.2f s (%s); %d of %d streams ready%s", self.load_s, self.model_description, ready,
                 self.settings.max_active_streams, "" if ready >= self.settings.max_active_streams
                 else " (the rest are built while serving)")

    def _load(self) -> None:
        from breeze_worker.engine.reference import ReferenceStore
        from breeze_worker.engine.runtime import Runtime
        from breeze_worker.engine.scheduler import Scheduler

        self.runtime = runtime = Runtime.load(self.settings)
        self.references = ReferenceStore(
            runtime.codec,
            max_entries=self.settings.reference_cache_entries,
            max_seconds=self.settings.max_reference_seconds,
            min_seconds=self.settings.min_reference_seconds,
        )
        self.scheduler = Scheduler(
            runtime,
            self.artifact_store,
            max_active=self.settings.max_active_streams,
            max_queue=self.settings.max_queue,
            max_queue_wait_s=self.settings.max_queue_wait_s,
            metrics=self.metrics,
            overlap=self.settings.codec_overlap,
            gather_s=self.settings.join_gather_ms / 1000,
            gather_quiet_s=self.settings.join_gather_quiet_ms / 1000,
            gather_burst_quiet_s=self.settings.join_gather_burst_quiet_ms / 1000,
            commit_threads=self.settings.artifact_commit_threads,
        )

    async def drain(self, grace_s: float) -> int:
        """Refuse new requests (UNAVAILABLE), end the queued ones, and wait up to `grace_s` for the running
        ones to finish (their artifacts committed); returns how many had not ended by then."""
        self.draining = True
        if self.scheduler is None:
            return 0
        self.scheduler.begin_drain()
        deadline = time.monotonic() + grace_s
        while self.scheduler.open_jobs() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.scheduler.open_jobs()

    async def stop(self) -> None:
        self.ready = False
        if self.runtime is not None:
            await asyncio.to_thread(self.runtime.stop_background)
        if self.scheduler is not None:
            await asyncio.to_thread(self.scheduler.stop)

    def _startup_progress(self) -> None:
        """The start-up build finished a piece (engine/startup.py): the engine thread re-reads its capacity."""
        if self.scheduler is not None:
            self.scheduler.wake()

    def readiness(self) -> dict:
        """How much of the configured capacity is ready (Runtime.readiness); before the model is loaded, none."""
        if self.runtime is None:
            return {"configured_streams": self.settings.max_active_streams, "ready_streams": 0, "complete": False,
                    "building": "the model", "failed": None, "fallback_steps": {}}
        return self.runtime.readiness()

    # ---- facts for health / info ----
    @property
    def sample_rate(self) -> int:
        return self.runtime.sample_rate if self.runtime else 24000

    @property
    def is_tiny_default(self) -> bool:
        return self.runtime is not None and self.runtime.is_tiny_default

    @property
    def not_speech_warning(self) -> str:
        """Why the audio is not speech (the tiny default, a synthetic checkpoint), for logs and clients; ""."""
        return self.runtime.not_speech_warning if self.runtime else ""

    @property
    def model_description(self) -> str:
        return self.runtime.description if self.runtime else "not loaded"

    # ---- requests ----
    async def synthesize(self, request: SynthesisRequest, *, timeout_s: float | None = None,
                         received_ns: int | None = None) -> AsyncIterator:
        """Yield JobStarted, AudioChunk..., JobFinished; raise breeze_worker.errors.* on failure.
        `received_ns`: the wall clock when the transport took the request (default: now), in JobStarted."""
        from breeze_worker.engine.request import check_request_id

        received_ns = time.time_ns() if received_ns is None else received_ns

        check_request_id(request.request_id)  # before any work: it labels this call's log lines
        if not self.ready:
            raise Unavailable("the model is still loading; wait for the health check to report SERVING")
        if self.draining:
            raise Unavailable("the worker is shutting down; retry on another worker")
        assert self.scheduler is not None  # ready: loaded
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.scheduler.arriving()  # an idle engine admitting a burst waits for it (scheduler.py, "Bursts")
        try:
            params = await self._resolve(request)  # None: reference audio to decode once a slot is held
        except BaseException:
            self.scheduler.arrival_failed()
            raise
        job = Job(job_id=new_job_id(), params=params, sink=EventSink(asyncio.get_running_loop()),
                  deadline=deadline, received_at_ns=received_ns)
        logs.bind(job_id=job.job_id)  # every later line of this call names the job
        self.scheduler.submit(job, arrived=True)
        if params is None:
            log.info("job %s queued (reference audio to decode once it holds a slot)", job.job_id)
        else:
            guidance = (f"guidance reference {params.cfg_scale_reference:.3g} instruction "
                        f"{params.cfg_scale_instruction:.3g}" if params.dual_cfg else f"cfg {params.cfg_scale:.3g}")
            log.info("job %s queued (template %s, %s, seed %d)", job.job_id, params.template.value, guidance,
                     params.seed)
        finished = False
        try:
            if params is None:
                try:
                    await self._prepare(job, request)
                except BaseException:
                    finished = True  # the slot went back in _prepare; nothing to cancel
                    raise
            while True:
                item = await job.sink.get()
                if item is None:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if not finished:
                job.cancel()
                self.scheduler.wake()
                log.info("job %s cancelled by the caller", job.job_id)

    async def _resolve(self, request: SynthesisRequest) -> ResolvedRequest | None:
        """The resolved request, or None when it carries new reference audio: then everything but the audio
        has been checked (its header included) and `_prepare` finishes the job once it holds a slot."""
        from breeze_worker.engine.reference import read_reference_header

        assert self.references is not None  # requests come once ready: loaded
        reference = None
        ref = request.reference
        if ref is not None and ref.reference_id:
            reference = self.references.get(ref.reference_id)
            if ref.transcript and ref.transcript != reference.transcript:
                raise InvalidRequest(
                    f"reference {ref.reference_id} is held with a different transcript; send no transcript with "
                    "a reference id, or send the audio again with the new transcript")
            if ref.audio:
                raise InvalidRequest("send either reference audio or a reference id, not both")
        elif ref is not None and ref.audio and ref.transcript:
            reference = await asyncio.to_thread(self.references.cached, ref.audio, ref.transcript)
            if reference is None:
                header = await asyncio.to_thread(read_reference_header, ref.audio,
                                                 self.settings.max_reference_seconds)
                self._resolve_with(request, self._stand_in(ref.transcript, header.frames / header.samplerate))
                return None
        return self._resolve_with(request, reference)

    def _resolve_with(self, request: SynthesisRequest, reference: ResolvedReference | None) -> ResolvedRequest:
        from breeze_worker.engine.request import resolve_request

        assert self.runtime is not None  # requests come once ready: loaded
        return resolve_request(request, self.runtime.model.generation_defaults, reference,
                               max_text_chars=self.settings.max_text_chars, tokenizer=self.runtime.model.tokenizer)

    def _stand_in(self, transcript: str, seconds: float) -> ResolvedReference:
        """A reference of the header's length (zero codes) for checking the request before the decode."""
        assert self.runtime is not None  # requests come once ready: loaded
        frames = max(1, math.ceil(seconds * self.runtime.model.generation_defaults.frame_rate))
        return ResolvedReference(reference_id="ref-" + "0" * 32, transcript=transcript,
                                 codes=np.zeros((frames, 16), dtype=np.int64), seconds=seconds)

    async def _prepare(self, job: Job, request: SynthesisRequest) -> None:
        """Wait for the slot the scheduler reserves, then decode and encode the reference and resolve the
        request; on any failure the slot goes back and the error reaches the caller."""
        assert self.references is not None and self.scheduler is not None  # requests come once ready: loaded
        try:
            granted = await job.sink.get()
            if isinstance(granted, BaseException):  # waited too long, deadline, or shutting down
                raise granted
            if granted != SLOT_GRANTED:
                raise RuntimeError(f"expected a slot grant before the job's events, got {granted!r}")
            ref = request.reference
            # prepared only when it carries reference audio and its transcript (`_resolve`)
            assert ref is not None and ref.audio and ref.transcript
            reference = await asyncio.to_thread(self.references.intake, ref.audio, ref.transcript)
            job.params = self._resolve_with(request, reference)
        except BaseException:
            self.scheduler.release(job)
            raise
        self.scheduler.prepared(job)
