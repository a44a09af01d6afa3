"""The engine thread: admission control, stepping active streams one frame at a time, finishing jobs.

All model work happens here, off the event loop. Streams join and leave at frame boundaries: each pass
of the loop drops cancelled or expired streams (their slots are free at once), admits waiting jobs into
free slots (all joiners of a pass in one `join`), and gives every active stream one frame through the
runtime's *stepper* (engine/stepper.py: one batched frame step on the fast path, engine/batching.py),
then decodes all the step's frames in ONE batched codec call. A job that ends hands its artifact commit
(fsync + rename) to an I/O pool (`commit_threads`) so the other streams never wait on the disk.

Slots before work: a job whose request still needs preparing (reference audio to decode and encode) has no
parameters yet. When a slot frees, the engine thread *reserves* it for that job and tells its caller
(`SLOT_GRANTED`); the caller prepares the request off this thread and hands it back (`prepared`), or gives
the slot back (`release`). So a full worker refuses or queues such a request before spending anything on it.

Bursts: a request counts as arriving from the moment the transport hands it over until it is submitted
(`arriving` ... `submit(arrived=True)`, or `arrival_failed`). An idle engine (no stream running) that finds
jobs to admit gathers the burst they may belong to, up to `gather_s` in all: it waits while others are
arriving, and until `gather_quiet_s` has passed since the last arrival, so that a burst onto an idle worker
joins at one boundary; otherwise its first request joins alone and the rest wait behind that join and its
first step. Why the quiet gap and not the arriving count alone: the event loop runs a plain request's
handler from its arrival to its submission without a pause, so the next request of a burst is not even
handed over while the engine decides; on an H200 a 64-client burst sent within 22-26 ms reached the
engine over 80-87 ms, about 1 ms apart (docs/perf-data/serve-0a67187-20261204.json). The gather ends at
once when the jobs waiting fill every free slot (no one else could join), and jobs that need preparing (reference audio
to decode and encode) get their slots during the gather, which waits for their preparation too, so they
join with the rest instead of one step later. A lone request waits `gather_quiet_s`, no more; once two
jobs wait, the burst has ended only after `gather_burst_quiet_s` without an arrival (the event loop can
pause longer than the lone request's gap inside a burst). A busy engine never waits (arrivals join at the
next step's boundary anyway). On by default (`join_gather_ms` 120, quiet gaps 2 and 10 ms): a burst split
in two loses a join and a step for the streams left out (on an H200, 64 clients: 47-49 joined at a 60 ms cap,
the rest ~140 ms later; with these settings every round joined at once, 236.2 -> 240.5x, TTFA p95 286 -> 257
ms: docs/performance.md, serve-0a67187-20261204.json and serve-d8bcb0a-20261204.json).

Drain (SIGTERM): `begin_drain` refuses new jobs and ends the queued ones at once (UNAVAILABLE, so their
callers retry elsewhere); jobs holding slots run on, and `open_jobs` says how many have not ended yet.

Delivery: the codec call of step t is launched, not waited for; its audio is read, encoded and handed to
the callers while step t+1 runs (the stepper calls back once that step's device work is queued), so the
host's per-stream work (encoding, the artifact write, the hand-over to the event loop) never leaves the GPU
idle. On one CUDA stream (the default) the codec's work is queued ahead of step t+1's, so the wait ends when
the codec is done; with `codec_overlap` (engine/codec_rows.py) the codec runs on its own stream beside step
t+1's language model. Whatever changes the codec batch (a join, a drop, a finish) first delivers the step in
flight, and a step after which no stream goes on delivers at once. A job whose last frame is in flight has
left the active list (its language-model slot is free) and finishes when that audio is delivered.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from breeze_worker.engine.codec_rows import CodecRows, PendingAudio, stack_frames
from breeze_worker.engine.metrics import EngineMetrics
from breeze_worker.engine.session import SLOT_GRANTED, Job, bytes_per_sample, encode_pcm, post
from breeze_worker.engine.stepper import StepOutcome
from breeze_worker.engine.types import EndReason, PcmEncoding
from breeze_worker.errors import (
    BreezeError,
    Cancelled,
    CodeOutOfRange,
    DeadlineExceeded,
    ResourceExhausted,
    Unavailable,
)

log = logging.getLogger(__name__)

SLOW_STEP_S = 1.0  # a step this long is logged and counted (breeze_slow_steps_total): every stream waited
SLOW_STEP_LOG_EVERY_S = 60.0  # after a slow-step warning, the next one waits this long (and says how many)


@dataclass
class _InFlight:
    """A launched codec step: its jobs, those whose last frame it holds, and the host time launching took."""

    audio: PendingAudio
    jobs: list
    ending: dict = field(default_factory=dict)  # Job -> EndReason
    launch_s: float = 0.0


class _RowBudget:
    """The model rows one admission pass may still hand out (steppers that count rows: engine/batching.py;
    others have no row limit). In queue order: once a request's rows are not free, the requests behind it wait
    too, so a request with two guidance scales (three rows) is not passed over for ever by smaller ones."""

    def __init__(self, stepper):
        self._rows_for = getattr(stepper, "rows_for", None)
        # rows of the built shapes only, while a progressive start-up is still building the others
        self._left = getattr(stepper, "ready_rows_free", stepper.rows_free) if self._rows_for is not None else 0
        self._blocked = False

    def need(self, job) -> int:
        return 0 if self._rows_for is None or job.params is None else self._rows_for(job.params)

    def fits(self, job) -> bool:
        return self._rows_for is None or job.params is None or (not self._blocked and self.need(job) <= self._left)

    def take(self, job) -> bool:
        """Whether the job's rows fit, taking them if so."""
        if not self.fits(job):
            self._blocked = True
            return False
        self._left -= self.need(job)
        return True


class Scheduler:
    """Owns the engine thread. `runtime` opens frame sources and codec streams (see engine/runtime.py)."""

    def __init__(self, runtime, artifact_store, *, max_active: int, max_queue: int, max_queue_wait_s: float,
                 metrics: EngineMetrics | None = None, overlap: bool = False, gather_s: float = 0.0,
                 gather_quiet_s: float = 0.002, gather_burst_quiet_s: float = 0.01, commit_threads: int = 2):
        self.runtime = runtime
        self.metrics = metrics or EngineMetrics()
        self.artifact_store = artifact_store
        self.max_active = max_active
        self.max_queue = max_queue
        self.max_queue_wait_s = max_queue_wait_s
        self._pending: collections.deque[Job] = collections.deque()
        self._active: list[Job] = []
        # jobs taken off the queue whose join (text encode + prefill) is running: they hold slots although
        # they are neither pending nor active yet (lock held to read or write)
        self._starting = 0
        # jobs holding a slot while their caller prepares the request; those handed back wait in _prepared
        self._reserved: list[Job] = []
        self._prepared: collections.deque[Job] = collections.deque()
        self._open: set[Job] = set()  # submitted and not ended yet (no final event or error sent)
        self._arriving = 0  # requests handed over by the transport and not submitted (or failed) yet
        self.gather_s = gather_s
        self.gather_quiet_s = gather_quiet_s
        self.gather_burst_quiet_s = max(gather_quiet_s, gather_burst_quiet_s)
        self._last_arrival = 0.0  # time.monotonic() of the latest `arriving` or `submit`
        self._draining = False
        self.overlap = overlap
        self._codec = CodecRows(runtime.codec, overlap=self.overlap)
        self._codebook_size = runtime.codec.codebook_size  # a sampled code at or above it never reaches the codec
        self._in_flight: _InFlight | None = None
        self._stepper = runtime.stepper_for(max_active)
        self._lock = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._ending: list = []  # (job, stats, done ns) ended, not yet handed to `_commit` (engine thread)
        self._io = ThreadPoolExecutor(max_workers=commit_threads, thread_name_prefix="artifact-io")
        self.steps = 0  # engine loop passes that stepped at least one stream (for tests and metrics)
        self._slow_unlogged = 0  # slow steps since the last warning
        self._slow_logged_at = float("-inf")

    # ---- event-loop side ----
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="breeze-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self._io.shutdown(wait=True)

    def arriving(self) -> None:
        """A request is being received (resolved, checked): `submit(job, arrived=True)` or `arrival_failed`
        follows."""
        with self._lock:
            self._arriving += 1
            self._last_arrival = time.monotonic()

    def arrival_failed(self) -> None:
        """An arriving request will not be submitted (it was refused before)."""
        with self._lock:
            self._arriving -= 1
            self._lock.notify_all()

    def submit(self, job: Job, arrived: bool = False) -> None:
        """Queue `job`; `arrived`: it was announced by `arriving` (its count ends here, refused or not)."""
        with self._lock:
            self._last_arrival = time.monotonic()
            if arrived:
                self._arriving -= 1
                self._lock.notify_all()
            if self._stopping or self._draining:
                raise Unavailable("the worker is shutting down; retry on another worker")
            # jobs the engine thread has not picked up yet may still take free slots: they are not queued
            held = self._slots_held()
            free_slots = max(0, self.max_active - held)
            if len(self._pending) >= self.max_queue + free_slots:
                raise ResourceExhausted(
                    f"the request queue is full ({self.max_queue} waiting, {held} "
                    f"active streams of max {self.max_active}); retry later or raise --max-queue"
                )
            self._pending.append(job)
            self._open.add(job)
            self._lock.notify_all()

    def prepared(self, job: Job) -> None:
        """The caller of a job holding a reserved slot has set `job.params`: it joins at the next pass."""
        with self._lock:
            if job not in self._reserved or job.cancelled:
                raise Unavailable("the job lost its stream slot (cancelled or shutting down); retry")
            self._prepared.append(job)
            self._lock.notify_all()

    def release(self, job: Job) -> None:
        """Withdraw a job whose request could not be prepared (the caller reports its error, or hung up),
        whether it still waits in the queue or holds a reserved slot."""
        with self._lock:
            for held in (self._pending, self._reserved, self._prepared):
                if job in held:
                    held.remove(job)
            self._open.discard(job)
            self._lock.notify_all()

    def begin_drain(self) -> None:
        """Refuse new jobs and end the queued ones (UNAVAILABLE); jobs holding slots run on."""
        with self._lock:
            self._draining = True
            queued, self._pending = list(self._pending), collections.deque()
            self._lock.notify_all()
        for job in queued:
            self._fail(job, Unavailable("the worker is shutting down and this request had not started; retry on "
                                        "another worker"))

    def open_jobs(self) -> int:
        """Jobs submitted and not ended yet (queued, preparing, running or committing their artifact)."""
        with self._lock:
            return len(self._open)

    def _slots_held(self) -> int:
        return len(self._active) + self._starting + len(self._reserved)

    def _capacity(self) -> int:
        """Streams that may hold slots now: `max_active`, or fewer while the start-up still builds the batch
        shapes the rest need (engine/startup.py; the runtime's `ready_streams`). Queued requests wait for it to
        grow as they would for a slot; the queue's bound stays `max_active`'s."""
        return min(self.max_active, int(getattr(self.runtime, "ready_streams", self.max_active)))

    def wake(self) -> None:
        """Called after a cancellation so the loop notices it even while idle."""
        with self._lock:
            self._lock.notify_all()

    def load(self) -> tuple[int, int]:
        with self._lock:
            return self._slots_held(), len(self._pending)

    # ---- engine thread ----
    def _run(self) -> None:
        while True:
            with self._lock:
                self.metrics.set_load(len(self._active), len(self._pending))  # an idle worker shows 0
                waited = time.perf_counter()
                while not self._stopping and not self._active and not self._pending and not self._prepared:
                    self._lock.wait()
                if self._stopping:
                    break
                if not self._active and self.gather_s > 0:  # a burst onto an idle engine ("Bursts")
                    self._gather_locked()
            busy_from = time.perf_counter()
            self.metrics.engine_time(0.0, busy_from - waited)
            self._drop_gone(time.monotonic())  # frees slots before admission
            with self._lock:
                admitted = self._take_admissible()
                self._starting = len(admitted)
            if admitted:
                try:
                    self._admit(admitted)
                finally:
                    with self._lock:
                        self._starting = 0
            self.metrics.set_load(len(self._active), len(self._pending))
            if self._active:
                streams, t0 = len(self._active), time.perf_counter()
                try:
                    self._step_all()
                except BaseException as exc:  # a bug in the step itself: fail its streams, keep serving
                    log.exception("engine step failed; failing the %d active stream(s)", len(self._active))
                    for job in list(self._active):
                        self._drop(job, exc)
                self._step_timed(streams, time.perf_counter() - t0)
            elif not admitted:
                idle_from = time.perf_counter()
                with self._lock:  # only expired or cancelled jobs are waiting: sleep briefly
                    self._lock.wait(0.01)
                self.metrics.engine_time(idle_from - busy_from, time.perf_counter() - idle_from)
                continue
            self.metrics.engine_time(time.perf_counter() - busy_from, 0.0)
        self._deliver()  # audio already decoded goes out; jobs whose last frame it held finish
        self._commit_ended()
        for job in list(self._active):
            self._drop(job, Unavailable("the worker shut down before this job finished; retry"))
        for job in list(self._pending) + list(self._reserved):
            self._fail(job, Unavailable("the worker shut down before this job finished; retry"))
        self._active.clear()
        self._pending.clear()
        self._reserved.clear()
        self._prepared.clear()
        self.metrics.set_load(0, 0)

    def _gather_locked(self) -> None:
        """Wait (lock held) while requests are arriving or their reference audio is being prepared, or until
        `gather_quiet_s` after the last arrival, at most `gather_s` in all; at once when the jobs waiting fill
        every free slot. Jobs that need preparing get their slots now, so that they prepare during the gather
        and join with the rest."""
        deadline = time.monotonic() + self.gather_s
        while not self._stopping:
            self._reserve_for_preparing()
            now = time.monotonic()
            if now >= deadline:
                return
            waiting = len(self._pending) + len(self._reserved)
            full = waiting >= self._capacity()  # no one else could join
            if len(self._reserved) > len(self._prepared) or (self._arriving and not full):
                self._lock.wait(deadline - now)
                continue
            if full:
                return
            burst = waiting > 1  # a burst is on: its end is a longer silence
            quiet_from = self._last_arrival + (self.gather_burst_quiet_s if burst else self.gather_quiet_s)
            if now >= quiet_from:
                return
            self._lock.wait(min(deadline, quiet_from) - now)

    def _reserve_for_preparing(self) -> None:
        """Reserve free slots for queued jobs still to be prepared (lock held, engine idle). In queue order: a
        prepared job queued ahead keeps its claim on a slot, as at admission (`_take_admissible`)."""
        if not any(job.params is None for job in self._pending):
            return
        kept: collections.deque[Job] = collections.deque()
        free = self._capacity() - self._slots_held()
        for job in self._pending:
            if free > 0 and job.params is None and not job.cancelled:
                self._grant_slot(job)
            else:
                kept.append(job)
            free -= 1
        self._pending = kept

    def _grant_slot(self, job: Job) -> None:
        """Reserve a slot for a job still to be prepared and tell its caller to prepare it (lock held)."""
        self._reserved.append(job)
        job.sink.put(SLOT_GRANTED)

    def _step_timed(self, streams: int, seconds: float) -> None:
        """Metrics for every step; a warning for a slow one, at most one per SLOW_STEP_LOG_EVERY_S (a CPU
        worker on a real checkpoint may be slow at every step)."""
        slow = seconds > SLOW_STEP_S
        self.metrics.step_done(seconds, slow)
        if not slow:
            return
        self._slow_unlogged += 1
        now = time.monotonic()
        if now - self._slow_logged_at < SLOW_STEP_LOG_EVERY_S:
            return
        log.warning("an engine step for %d stream(s) took %.2f s (usually tens of ms on a GPU): every active "
                    "stream waited (%d slow step(s) since the last such warning)%s", streams, seconds,
                    self._slow_unlogged, "; the codec overlap is on, which stalled 16-stream steps on an H200 "
                    "(--codec-overlap)" if self.overlap else "")
        self._slow_unlogged, self._slow_logged_at = 0, now

    def _take_admissible(self) -> list[Job]:
        """Pop jobs that may start now (prepared ones first: they hold their slots); reserve slots for jobs
        still to be prepared; fail those that waited too long or went away (lock held)."""
        now = time.monotonic()
        taken = []
        for job in [j for j in self._reserved if j.cancelled]:  # its caller hung up while preparing or waiting
            self._reserved.remove(job)
            if job in self._prepared:
                self._prepared.remove(job)
            self._open.discard(job)
        rows = _RowBudget(self._stepper)
        while self._prepared:
            job = self._prepared[0]
            if not rows.take(job):  # its model rows are busy: it waits, holding its slot, within the queue's limits
                if job.expired(now):
                    self._unreserve_prepared(job, DeadlineExceeded(
                        "the deadline passed while the request waited for free model rows"))
                    continue
                if now - job.submitted_at > self.max_queue_wait_s:
                    self._unreserve_prepared(job, self._waited_for_rows(job, now, rows))
                    continue
                break
            self._prepared.popleft()
            self._reserved.remove(job)
            taken.append(job)
        kept: collections.deque[Job] = collections.deque()
        capacity = self._capacity()
        while self._pending:
            job = self._pending.popleft()
            if job.cancelled:
                self._open.discard(job)
                job.sink.close()
            elif job.expired(now):
                self._fail(job, DeadlineExceeded("the deadline passed while the request waited for a slot"))
            elif now - job.submitted_at > self.max_queue_wait_s:
                slot_free = len(self._active) + len(taken) + len(self._reserved) < capacity
                if slot_free and not rows.fits(job):
                    self._fail(job, self._waited_for_rows(job, now, rows))
                else:
                    self._fail(job, ResourceExhausted(
                        f"waited {now - job.submitted_at:.1f} s for a free stream slot (max_queue_wait_s="
                        f"{self.max_queue_wait_s:g}, max_active_streams={self.max_active}); retry later"))
            elif len(self._active) + len(taken) + len(self._reserved) < capacity:
                if job.params is None:  # its caller prepares it now, holding the slot
                    self._grant_slot(job)
                elif rows.take(job):
                    taken.append(job)
                else:  # its model rows are busy: it keeps its place in the queue
                    kept.append(job)
            else:
                kept.append(job)
        self._pending = kept
        return taken

    def _waited_for_rows(self, job: Job, now: float, rows: _RowBudget) -> ResourceExhausted:
        return ResourceExhausted(
            f"waited {now - job.submitted_at:.1f} s for {rows.need(job)} free model rows (max_queue_wait_s="
            f"{self.max_queue_wait_s:g}; a request takes a row per prompt branch: guidance 2, two guidance "
            "scales 3); retry later")

    def _unreserve_prepared(self, job: Job, exc: BaseException) -> None:
        """A prepared job that waited for model rows in vain gives its slot back and fails (lock held)."""
        self._prepared.remove(job)
        self._reserved.remove(job)
        self._fail(job, exc)

    def _admit(self, jobs: list[Job]) -> None:
        """Start jobs at this frame boundary: artifacts, then one `join` for all (prompt encode + prefill)."""
        self._deliver()  # the running streams' audio goes out before the join; the codec batch changes below
        joiners = []
        for job in jobs:
            job.started_at = time.monotonic()
            job.started_at_ns = time.time_ns()
            try:
                assert job.params is not None  # only prepared jobs are taken (`_take_admissible`)
                job.artifact = self.artifact_store.begin(job.job_id, self.runtime.sample_rate, job.params.encoding)
            except BaseException as exc:  # this job only
                self._fail(job, exc)
                continue
            joiners.append(job)
        if not joiners:
            return
        try:
            errors = self._stepper.join([(job, job.params) for job in joiners])
        except BaseException as exc:  # the join itself failed: its joiners fail, running streams go on
            log.exception("join of %d stream(s) failed", len(joiners))
            errors = {job: exc for job in joiners}
        joined = []
        for job in joiners:
            if job in errors:
                self._stepper.leave(job)
                self._forget(job)
                self._fail(job, errors[job])
                continue
            started = job.started_event(self.runtime.sample_rate)
            self.metrics.job_started(started.queue_wait_s)
            job.sink.put(started)
            with self._lock:  # its slot moves from starting to active in one step, as submit() sees it
                self._active.append(job)
                self._starting -= 1
            joined.append(job)
        self._codec.add_all(joined)  # the codec batch grows once for the pass's joiners

    def _drop_gone(self, now: float) -> None:
        """Cancelled or expired streams leave now: their slots are free for this pass's admission."""
        if any(job.cancelled or job.expired(now) for job in self._active):
            self._deliver()
        for job in list(self._active):
            if job.cancelled:
                self._drop(job, Cancelled("the caller cancelled the request"))
            elif job.expired(now):
                self._drop(job, DeadlineExceeded(
                    f"the deadline passed after {job.frames} frames; raise the timeout or lower the frame limit"))

    def _step_all(self) -> None:
        """One frame for every active stream (one stepper call), then one batched codec call for all,
        delivered during the next step (see the module doc) or at once."""
        self.steps += 1
        try:  # the previous step's audio is read while this step's device work runs
            outcomes: dict[Job, StepOutcome] = self._stepper.step(while_running=self._deliver)
        finally:
            self._deliver()  # nothing left to read if the stepper did; else (it queued no work) now
        frames, ending = {}, {}
        for job in list(self._active):
            out = outcomes.get(job)
            if out is None:
                self._drop(job, RuntimeError("the stepper gave no outcome for an active stream"))
            elif out.error is not None:
                self._drop(job, out.error)
            elif out.frame is None:
                self._finish(job, out.end_reason or EndReason.FRAME_LIMIT)
            else:
                frames[job] = out.frame
                if out.end_reason is not None:  # that is its last frame
                    ending[job] = out.end_reason
        self._commit_ended()
        for job, bad in self._out_of_range(frames).items():  # those streams only: never to the codec
            del frames[job]
            ending.pop(job, None)
            self._drop(job, CodeOutOfRange(
                f"frame {job.frames} holds code {bad}, outside the codec's range [0, {self._codebook_size}); "
                "the frame was discarded"))
        for job in frames:
            job.frames += 1
        if not frames:
            return
        t0 = time.perf_counter()
        try:
            audio = self._codec.launch(frames, timed=True)  # its own time, for the stage split (_deliver)
        except BaseException as exc:  # the codec failed: every stream in the batch is affected
            for job in frames:
                self._drop(job, exc)
            return
        self._in_flight = _InFlight(audio, list(frames), ending, time.perf_counter() - t0)
        for job in ending:  # its slot is free for admission; it finishes when its audio is delivered
            self._active.remove(job)
        if not self._active:  # no next step to overlap with
            self._deliver()

    def _out_of_range(self, frames: dict) -> dict:
        """{job: the first code of its frame (int64 [16], on the CPU) the codec cannot decode} for the frames
        holding one; checked for all streams in one call."""
        if not frames:
            return {}
        stacked = stack_frames(frames.values())
        bad = (stacked < 0) | (stacked >= self._codebook_size)
        if not bool(bad.any()):
            return {}
        rows = bad.any(dim=1).tolist()
        return {job: int(stacked[i][bad[i]][0]) for i, job in enumerate(frames) if rows[i]}

    def _deliver(self) -> None:
        """Read the codec step in flight (if any), send each job its audio and finish the jobs it ended."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        t0 = time.perf_counter()
        try:
            samples, rows = flight.audio.wait_rows()
        except BaseException as exc:  # the codec failed: every stream in the batch is affected
            for job in flight.jobs:
                self._drop(job, exc)
            return
        waited_s = flight.launch_s + time.perf_counter() - t0
        # Serial on CUDA, the codec's step is queued behind the next frame's backbone step on the same
        # stream, so the wait holds both: the codec's own time (its events) is codec_s, the rest the
        # language model's. Overlapped (its own stream) or on the CPU, the wait is all codec.
        own_ms = flight.audio.device_ms()
        behind_lm = flight.audio.queued_on_device and not self.overlap
        codec_s = min(waited_s, own_ms / 1000) if behind_lm and own_ms is not None else waited_s
        # every stream's PCM from one encoding pass over the step's rows (a row's bytes are the row's own),
        # and every stream's chunk handed to the event loop with one wake-up (session.post)
        encoded: dict[PcmEncoding, bytes] = {}
        width = samples.shape[1]
        chunks = []
        for job in flight.jobs:
            job.timers.codec_s += codec_s
            job.timers.lm_wait_s += waited_s - codec_s
            assert job.params is not None  # every admitted job has its parameters
            encoding = job.params.encoding
            if encoding not in encoded:
                encoded[encoding] = encode_pcm(samples, encoding)
            size, row = width * bytes_per_sample(encoding), rows[job]
            chunk = job.add_pcm(encoded[encoding][row * size:(row + 1) * size], width, flush=False)
            if chunk is not None:
                chunks.append((job.sink, chunk))
        post(chunks)
        for job in flight.jobs:
            if job in flight.ending:
                self._finish(job, flight.ending[job])
        self._commit_ended()

    def _take_stream_info(self, job: Job) -> None:
        info = self._stepper.stream_info(job)
        job.timers.text_encode_s = float(info.get("text_encode_s", 0.0))
        job.timers.prefill_s = float(info.get("prefill_s", 0.0))
        job.timers.generate_s = float(info.get("generate_s", 0.0)) + job.timers.lm_wait_s
        job.nonfinite_events = int(info.get("nonfinite_events", 0))
        job.nonfinite_layer = str(info.get("nonfinite_layer", ""))
        recovered = int(info.get("nonfinite_recovered", 0))
        self.metrics.nonfinite_frames(recovered=recovered, failed=job.nonfinite_events - recovered)
        self._forget(job)

    def _forget(self, job: Job) -> None:
        forget = getattr(self._stepper, "forget", None)
        if forget is not None:
            forget(job)

    def _finish(self, job: Job, end_reason: EndReason) -> None:
        if job in self._active:
            self._active.remove(job)
        self._codec.remove(job)
        self._stepper.leave(job)
        chunk = job.add_pcm(b"", 0, flush=True)
        if chunk is not None:
            job.sink.put(chunk)
        self._take_stream_info(job)
        done_at = time.monotonic()
        done_at_ns = time.time_ns()
        stats = job.stats(end_reason, self.runtime.sample_rate, done_at)
        self.metrics.job_ended(end_reason.value, stats)
        self._ending.append((job, stats, done_at_ns))

    def _commit_ended(self) -> None:
        """Hand the jobs that ended since the last call to an I/O thread, to commit their artifacts together
        (one group: ArtifactStore.commit_together shares the syncs)."""
        if self._ending:
            group, self._ending = self._ending, []
            self._io.submit(self._commit, group)

    def _commit(self, group: list) -> None:
        """Commit the group's artifacts (a storage fault gives one up, its job still finishes); then every
        job's final event and end, handed to the event loop at once (one wake-up, not two a job)."""
        try:
            infos = self.artifact_store.commit_together([job.artifact for job, _, _ in group])
        except BaseException as exc:  # a bug, not a storage fault (the writers contain those)
            log.exception("artifact commit failed for %d job(s)", len(group))
            for job, _, _ in group:
                self._fail(job, exc)
            return
        post([delivery for (job, stats, done_at_ns), info in zip(group, infos)
              for delivery in job.sink.last(job.finished_event(stats, done_at_ns, info,
                                                               job.artifact.unavailable_reason))])
        for job, _, _ in group:
            self._ended(job)

    def _ended(self, job: Job) -> None:
        with self._lock:
            self._open.discard(job)
            if not self._open:
                self._lock.notify_all()

    def _drop(self, job: Job, exc: BaseException) -> None:
        if job in self._active:
            self._active.remove(job)
        self._codec.remove(job)
        self._stepper.leave(job)  # its slot is free from the next step on
        self._take_stream_info(job)
        self._fail(job, exc)

    def _fail(self, job: Job, exc: BaseException) -> None:
        self.metrics.job_ended("cancelled" if isinstance(exc, Cancelled) else "error")
        if job.artifact is not None:
            try:
                job.artifact.abort()
            except Exception:
                log.exception("job %s: artifact abort failed", job.job_id)
        if not isinstance(exc, BreezeError):
            log.error("job %s failed", job.job_id, exc_info=exc)
        job.sink.put(exc)
        job.sink.close()
        self._ended(job)
