"""Engine counters, gauges and histograms, kept and rendered by prometheus-client.

The engine thread updates them; the transport's `/metrics` endpoint renders `render()` (the Prometheus text
format, `CONTENT_TYPE`). Each engine has its own registry, so several engines in one process (tests,
benchmarks) never share numbers. Names follow Prometheus conventions (`breeze_*_total`, `*_seconds`).
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from breeze_worker import logs

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)
_STEP_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.5, 1.0, 5.0, 10.0)  # 0.08: one frame of audio
_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.5, 1.0)


class EngineMetrics:
    def __init__(self, artifact_status=None, readiness=None) -> None:
        """`artifact_status`: a callable returning the artifact store's StoreStatus (read at each scrape);
        `readiness`: one returning the engine's readiness document (Engine.readiness)."""
        self.registry = CollectorRegistry()
        r = self.registry
        if artifact_status is not None:
            r.register(_ArtifactCollector(artifact_status))
        if readiness is not None:
            r.register(_ReadinessCollector(readiness))
        r.register(_LogCollector())
        self._jobs = Counter("breeze_jobs_total", "jobs finished, by end reason (end_of_speech, frame_limit, "
                             "cancelled, error)", ["end_reason"], registry=r)
        self._frames = Counter("breeze_frames_total", "audio frames (80 ms each) generated", registry=r)
        self._audio = Counter("breeze_audio_seconds_total", "seconds of audio streamed", registry=r)
        self._nonfinite = Counter("breeze_nonfinite_events_total", "frames whose values went non-finite, by "
                                  "outcome: recovered (recomputed at a safe precision, emitted, the stream went on) "
                                  "or failed (not finite at the safe precision either: never emitted, the request "
                                  "ended)", ["outcome"], registry=r)
        for outcome in ("recovered", "failed"):
            self._nonfinite.labels(outcome=outcome)
        self._slow_steps = Counter("breeze_slow_steps_total", "engine steps that took longer than 1 s (every "
                                   "active stream waited)", registry=r)
        self._active = Gauge("breeze_active_streams", "streams decoding now", registry=r)
        self._queued = Gauge("breeze_queued_requests", "requests waiting for a stream slot", registry=r)
        self._ttfa = Histogram("breeze_ttfa_seconds", "job start to first audio chunk", buckets=_LATENCY_BUCKETS,
                               registry=r)
        self._queue_wait = Histogram("breeze_queue_wait_seconds", "time a request waited for a slot",
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self._rtf = Histogram("breeze_rtf", "per-job real-time factor (wall / audio, lower is better)",
                              buckets=_RTF_BUCKETS, registry=r)
        self._step = Histogram("breeze_step_seconds", "one engine step: a frame for every active stream, with "
                               "its audio (above 0.08 s the streams fall behind real time)", buckets=_STEP_BUCKETS,
                               registry=r)
        # what the worker process itself costs (is the host side ever what limits a stream?)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, resident memory, open files
        self._engine_idle = Counter("breeze_engine_idle_seconds", "time the engine thread waited with no stream "
                                    "to step and no request to admit", registry=r)
        self._engine_busy = Counter("breeze_engine_busy_seconds", "time the engine thread spent admitting and "
                                    "stepping streams (device waits included)", registry=r)
        self._loop_lag = Histogram("breeze_event_loop_lag_seconds", "how late the gRPC event loop ran a timer "
                                   "(a loop busy with Python work delays every stream's messages)",
                                   buckets=_LAG_BUCKETS, registry=r)
        self._messages = Counter("breeze_stream_messages", "Synthesize messages written to clients", registry=r)
        self._gc_pause = Histogram("breeze_gc_pause_seconds", "garbage-collector pauses (every thread waits), by "
                                   "generation", ["generation"], buckets=_LAG_BUCKETS, registry=r)

    def engine_time(self, busy_s: float, idle_s: float) -> None:
        if busy_s > 0:
            self._engine_busy.inc(busy_s)
        if idle_s > 0:
            self._engine_idle.inc(idle_s)

    def loop_lag(self, seconds: float) -> None:
        self._loop_lag.observe(max(0.0, seconds))

    def message_sent(self) -> None:
        self._messages.inc()

    def gc_pause(self, generation: int, seconds: float) -> None:
        self._gc_pause.labels(str(generation)).observe(seconds)

    def job_started(self, queue_wait_s: float) -> None:
        self._queue_wait.observe(queue_wait_s)

    def job_ended(self, end_reason: str, stats=None) -> None:
        self._jobs.labels(end_reason=end_reason).inc()
        if stats is not None:
            self._frames.inc(stats.frames)
            self._audio.inc(stats.audio_seconds)
            if stats.audio_seconds > 0:
                self._ttfa.observe(stats.ttfa_s)
                self._rtf.observe(stats.rtf)

    def nonfinite_frames(self, recovered: int, failed: int) -> None:
        """A job's frames whose values went non-finite (counted when it ends or fails)."""
        if recovered > 0:
            self._nonfinite.labels(outcome="recovered").inc(recovered)
        if failed > 0:
            self._nonfinite.labels(outcome="failed").inc(failed)

    def step_done(self, seconds: float, slow: bool) -> None:
        self._step.observe(seconds)
        if slow:
            self._slow_steps.inc()

    def set_load(self, active: int, queued: int) -> None:
        self._active.set(active)
        self._queued.set(queued)

    def render(self) -> str:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry).decode()


class _LogCollector:
    """Log records dropped because stderr was not read fast enough (logs.BackgroundHandler), at each scrape."""

    def collect(self):
        yield CounterMetricFamily("breeze_log_records_dropped", "log records dropped because the log output "
                                  "(stderr) was not read fast enough", value=logs.dropped_records())


class _ReadinessCollector:
    """How much of the configured capacity is ready (engine/startup.py builds the rest while serving), read at
    each scrape."""

    def __init__(self, readiness):
        self._readiness = readiness

    def collect(self):
        doc = self._readiness()
        yield GaugeMetricFamily("breeze_streams_ready", "streams the worker admits now (fewer than configured while "
                                "its start-up still builds the batch shapes the rest need)",
                                value=doc["ready_streams"])
        yield GaugeMetricFamily("breeze_streams_configured", "streams the worker is configured to decode at once",
                                value=doc["configured_streams"])
        yield GaugeMetricFamily("breeze_startup_complete", "1 once every batch shape is built as configured, else 0",
                                value=int(bool(doc["complete"])))
        slow = CounterMetricFamily("breeze_slower_form_steps", "engine steps that ran slower than configured, by "
                                   "kind (uncompiled: its compiled build not ready yet; eager: no CUDA graph)",
                                   labels=["kind"])
        for kind, count in sorted(doc.get("fallback_steps", {}).items()):
            slow.add_metric([kind], count)
        yield slow


class _ArtifactCollector:
    """The artifact store's state, read from the store at each scrape (it changes off the engine thread)."""

    def __init__(self, status):
        self._status = status

    def collect(self):
        st = self._status()
        yield GaugeMetricFamily("breeze_artifact_store_degraded", "1 while the artifact store cannot write (jobs "
                                "stream audio without an artifact), else 0", value=int(st.degraded))
        yield GaugeMetricFamily("breeze_artifact_disk_free_bytes", "free bytes on the artifact disk",
                                value=st.free_bytes)
        unavailable = CounterMetricFamily("breeze_artifacts_unavailable", "artifacts given up while their audio "
                                          "streamed on, by cause (no_space, io_error, read_only, headroom, other)",
                                          labels=["cause"])
        for cause, count in sorted(st.unavailable.items()):
            unavailable.add_metric([cause], count)
        yield unavailable
        yield CounterMetricFamily("breeze_artifacts_evicted", "artifacts evicted early to keep the free-space "
                                  "headroom", value=st.evicted)
