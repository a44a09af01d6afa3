"""Engine counters, gauges and histograms, rendered in the Prometheus text format.

No client library: a handful of thread-safe numbers that the engine thread updates and the transport's
`/metrics` endpoint renders. Names follow Prometheus conventions (`breeze_*_total`, `*_seconds`).
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)
_STEP_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.5, 1.0, 5.0, 10.0)  # 0.08: one frame of audio


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def render(self, name: str) -> list[str]:
        lines, running = [], 0
        for bound, count in zip(self.buckets, self.counts):
            running += count
            lines.append(f'{name}_bucket{{le="{bound:g}"}} {running}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        lines.append(f"{name}_sum {self.total:.6f}")
        lines.append(f"{name}_count {self.n}")
        return lines


class EngineMetrics:
    HELP = {
        "breeze_jobs_total": ("counter", "jobs finished, by end reason (end_of_speech, frame_limit, cancelled, error)"),
        "breeze_frames_total": ("counter", "audio frames (80 ms each) generated"),
        "breeze_audio_seconds_total": ("counter", "seconds of audio streamed"),
        "breeze_nonfinite_events_total": ("counter", "frames whose logits held NaN/Inf (never emitted)"),
        "breeze_slow_steps_total": ("counter", "engine steps that took longer than 1 s (every active stream waited)"),
        "breeze_active_streams": ("gauge", "streams decoding now"),
        "breeze_queued_requests": ("gauge", "requests waiting for a stream slot"),
        "breeze_ttfa_seconds": ("histogram", "job start to first audio chunk"),
        "breeze_queue_wait_seconds": ("histogram", "time a request waited for a slot"),
        "breeze_rtf": ("histogram", "per-job real-time factor (wall / audio, lower is better)"),
        "breeze_step_seconds": ("histogram", "one engine step: a frame for every active stream, with its audio "
                                             "(above 0.08 s the streams fall behind real time)"),
        "breeze_artifact_store_degraded": ("gauge", "1 while the artifact store cannot write (jobs stream audio "
                                                    "without an artifact), else 0"),
        "breeze_artifact_disk_free_bytes": ("gauge", "free bytes on the artifact disk"),
        "breeze_artifacts_unavailable_total": ("counter", "artifacts given up while their audio streamed on, by cause "
                                                          "(no_space, io_error, read_only, headroom, other)"),
        "breeze_artifacts_evicted_total": ("counter", "artifacts evicted early to keep the free-space headroom"),
    }

    def __init__(self, artifact_status=None):
        """`artifact_status`: a callable returning the artifact store's StoreStatus (read at each render)."""
        self._artifact_status = artifact_status
        self._lock = threading.Lock()
        self.jobs = defaultdict(int)
        self.frames = 0
        self.audio_seconds = 0.0
        self.nonfinite_events = 0
        self.active = 0
        self.queued = 0
        self.ttfa = _Histogram(_LATENCY_BUCKETS)
        self.queue_wait = _Histogram(_LATENCY_BUCKETS)
        self.rtf = _Histogram(_RTF_BUCKETS)
        self.step = _Histogram(_STEP_BUCKETS)
        self.slow_steps = 0

    def job_started(self, queue_wait_s: float) -> None:
        with self._lock:
            self.queue_wait.observe(queue_wait_s)

    def job_ended(self, end_reason: str, stats=None) -> None:
        with self._lock:
            self.jobs[end_reason] += 1
            if stats is not None:
                self.frames += stats.frames
                self.audio_seconds += stats.audio_seconds
                self.nonfinite_events += stats.nonfinite_events
                if stats.audio_seconds > 0:
                    self.ttfa.observe(stats.ttfa_s)
                    self.rtf.observe(stats.rtf)

    def step_done(self, seconds: float, slow: bool) -> None:
        with self._lock:
            self.step.observe(seconds)
            self.slow_steps += int(slow)

    def set_load(self, active: int, queued: int) -> None:
        with self._lock:
            self.active, self.queued = active, queued

    def render(self) -> str:
        with self._lock:
            values = {
                "breeze_frames_total": [f"breeze_frames_total {self.frames}"],
                "breeze_audio_seconds_total": [f"breeze_audio_seconds_total {self.audio_seconds:.3f}"],
                "breeze_nonfinite_events_total": [f"breeze_nonfinite_events_total {self.nonfinite_events}"],
                "breeze_slow_steps_total": [f"breeze_slow_steps_total {self.slow_steps}"],
                "breeze_active_streams": [f"breeze_active_streams {self.active}"],
                "breeze_queued_requests": [f"breeze_queued_requests {self.queued}"],
                "breeze_jobs_total": [f'breeze_jobs_total{{end_reason="{k}"}} {v}' for k, v in sorted(self.jobs.items())],
                "breeze_ttfa_seconds": self.ttfa.render("breeze_ttfa_seconds"),
                "breeze_queue_wait_seconds": self.queue_wait.render("breeze_queue_wait_seconds"),
                "breeze_rtf": self.rtf.render("breeze_rtf"),
                "breeze_step_seconds": self.step.render("breeze_step_seconds"),
            }
        values.update(self._artifact_lines())
        out = []
        for name, (kind, help_text) in self.HELP.items():
            if name not in values:
                continue
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(values[name])
        return "\n".join(out) + "\n"

    def _artifact_lines(self) -> dict[str, list[str]]:
        if self._artifact_status is None:
            return {}
        st = self._artifact_status()
        return {
            "breeze_artifact_store_degraded": [f"breeze_artifact_store_degraded {int(st.degraded)}"],
            "breeze_artifact_disk_free_bytes": [f"breeze_artifact_disk_free_bytes {st.free_bytes}"],
            "breeze_artifacts_unavailable_total": [f'breeze_artifacts_unavailable_total{{cause="{k}"}} {v}'
                                                   for k, v in sorted(st.unavailable.items())],
            "breeze_artifacts_evicted_total": [f"breeze_artifacts_evicted_total {st.evicted}"],
        }
