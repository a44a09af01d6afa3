"""The retrieval phase model: one definition used by the SDK, the CLI, the JSON output and the HTML report.

A retrieval is a chain of nine events, each a nanosecond timestamp on the *client's* clock (`clock.now_ns`:
the wall clock as read when the SDK loaded, advanced by the monotonic clock, so a step of this machine's wall
clock moves no client event and no client-only phase). Four of them happen on the worker; their worker-clock
values are mapped onto the client clock with the clock exchange (`client_ns = server_ns - offset_ns`), which
is uncertain by up to `clock_uncertainty_ns` (half the fastest exchange's round trip). The eight phases
between consecutive events are what a slow retrieval is split into:

    generation_done --commit--> artifact_committed --notify--> final_received --client_gap--> request_sent
    --request--> request_received --server_first_byte--> first_byte_sent --first_byte_transit-->
    first_byte_received --transfer--> last_byte_received --client_write--> file_fsynced

A phase whose two ends are on the same machine does not depend on the clock mapping; a phase that
crosses between the machines is uncertain by the mapping's uncertainty for its worker event
(`Timeline.event_uncertainty_ns`, else `clock_uncertainty_ns`), and one shorter than that is labelled
as such. So is the total (generation done -> file on disk), which starts on the worker and ends on the
client, and the wait between the commit and the request (`waited_ns`: how long the file sat committed
before anyone asked for it, the delay a user of existing artifacts sees). A phase is never reported as
a measurement when it cannot be one: when the clock check could not map its worker event
(`Timeline.unmeasured`), or when it comes out negative beyond its uncertainty, or longer than the whole
run as the client saw it (a worker clock that stepped); its duration is then None with the reason.

"First byte" is the Fetch response's first byte: the worker's first message is a small header (artifact
info and times, no file bytes), so first-byte transit is the path's one-way latency and every file byte
arrives in the transfer phase; the transfer rate is file bytes / transfer time, one definition for the
SDK (`FetchResult.mb_per_s`), the CLI, the JSON and the report. A worker that puts data in its first
message is still measured right: `Timeline.first_chunk_bytes` says how many bytes arrived with it.

A client that writes each chunk as it arrives spends part of the transfer span inside write calls. That
time (`Timeline.write_during_transfer_ns`) is attributed to the client write phase, not to the transfer:
a phase's `duration_ns` is its event span with that correction, `span_ns` the raw span.

`Timeline.evidence` holds what each phase carries besides its span (the worker's fsync, read and send
times, the client's CPU wait, the chunks' arrival span...; keys are listed at `EVIDENCE`), which the
verdict compares before it names a cause. Everything here is a pure function of `Timeline` records: no
I/O, no gRPC.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# ---- events, in order ----
GENERATION_DONE = "generation_done"  # worker: the engine produced the job's last frame
ARTIFACT_COMMITTED = "artifact_committed"  # worker: the WAV is fsynced and renamed into place
FINAL_RECEIVED = "final_received"  # client: the Synthesize stream's final message arrived
REQUEST_SENT = "request_sent"  # client: the Fetch call was issued
REQUEST_RECEIVED = "request_received"  # worker: the Fetch call reached the handler
FIRST_BYTE_SENT = "first_byte_sent"  # worker: the response's first message (header) was handed to gRPC
FIRST_BYTE_RECEIVED = "first_byte_received"  # client: the response's first message arrived
LAST_BYTE_RECEIVED = "last_byte_received"  # client: every byte is in (the stream's last message arrived)
FILE_FSYNCED = "file_fsynced"  # client: the file is written, fsynced and verified on disk

EVENTS: tuple[str, ...] = (
    GENERATION_DONE, ARTIFACT_COMMITTED, FINAL_RECEIVED, REQUEST_SENT, REQUEST_RECEIVED,
    FIRST_BYTE_SENT, FIRST_BYTE_RECEIVED, LAST_BYTE_RECEIVED, FILE_FSYNCED,
)
SERVER_EVENTS: frozenset[str] = frozenset({GENERATION_DONE, ARTIFACT_COMMITTED, REQUEST_RECEIVED, FIRST_BYTE_SENT})

# Timeline.evidence keys (ns unless named otherwise; times on the client clock, durations on the clock they
# were measured on). Absent = unknown.
EVIDENCE: dict[str, str] = {
    "job_request_sent": "client: the Synthesize call was made (the run starts here)",
    "commit_started": "worker (mapped): the artifact writer took the job up",
    "commit_storage_ns": "worker: time inside the commit's storage calls (fsyncs, hash read-back, renames)",
    "commit_fsync_ns": "worker: time inside the commit's fsyncs (WAV, sidecar, directory)",
    "commit_bytes": "worker: bytes the commit's syncs wrote (the WAV's part not yet on the volume, and the sidecar)",
    "worker_open_ns": "worker: request received -> file opened and checked",
    "worker_read_ns": "worker: time reading (and compressing) the chunks",
    "worker_send_wait_ns": "worker: time its writes waited for the connection to take the chunks",
    "worker_send_span_ns": "worker: first data message sent -> last byte sent",
    "last_byte_sent": "worker (mapped): the stream's last message was handed to gRPC",
    "data_receive_span_ns": "client: first data message received -> last byte received",
    "path_queue_ns": "the slowest chunk's send -> arrival less the fastest one's: how long bytes queued on the path",
    "client_cpu_wait_ns": "client: the fetching thread's wait for a CPU, request -> file on disk",
    "client_cpu_run_ns": "client: its time on a CPU over the same span",
    "synthesis_cpu_wait_ns": "client: the streaming thread's wait for a CPU during the Synthesize call",
    "client_gap_cpu_wait_ns": "client: the thread's wait for a CPU from the final message to the artifact request "
                              "(when one thread did both)",
    "artifact_channel_opened": "client: the artifact channel the fetch used was opened",
    "artifact_clock_measured": "client: that channel's clock mapping was measured",
    "worker_audio_span_ns": "worker: first audio chunk emitted -> generation done",
    "client_audio_span_ns": "client: first audio chunk received -> final message received",
    "stream_window_bytes": "client: the channel's fixed HTTP/2 stream window (absent: BDP probing grows it)",
    "synthesis_rtt_ns": "the synthesis channel's round trip (its clock exchange)",
    # the worker's own wait for a CPU (its threads' scheduler statistics; absent where it cannot measure it)
    "worker_commit_cpu_wait_ns": "worker: the commit's threads' wait for a CPU (I/O thread woken -> commit end)",
    "worker_commit_cpu_run_ns": "worker: the committing thread's time on a CPU",
    "worker_commit_storage_cpu_wait_ns": "worker: of the commit's wait, the part inside its storage calls",
    "worker_commit_fsync_cpu_wait_ns": "worker: of that, the part inside its fsyncs",
    "worker_notify_span_ns": "worker: commit end -> the final message handed to gRPC",
    "worker_notify_cpu_wait_ns": "worker: how long it was held from running over the same span (its event loop's wait "
                                 "for a CPU, or its CPU quota)",
    "worker_arrival_cpu_wait_ns": "worker: how long it was held from running (its event loop's wait for a CPU, or "
                                  "its CPU quota) from the job's final message to the Fetch reaching its handler",
    "worker_open_cpu_wait_ns": "worker: its wait for a CPU from the request received to the header sent",
    "worker_read_cpu_wait_ns": "worker: its reading threads' wait for a CPU inside the chunks' reads",
    "worker_handler_cpu_wait_ns": "worker: how long it was held from running (as above), request -> last byte",
    "worker_handler_cpu_run_ns": "worker: its time on a CPU over the same span",
    "worker_handler_span_ns": "worker: request received -> last byte sent",
}


@dataclass(frozen=True)
class Phase:
    """One span between two consecutive events."""

    name: str
    start: str
    end: str
    title: str  # short human label
    where: str  # "server", "client" or "network" (crosses the machines)
    meaning: str

    @property
    def crosses_clocks(self) -> bool:
        return (self.start in SERVER_EVENTS) != (self.end in SERVER_EVENTS)


PHASES: tuple[Phase, ...] = (
    Phase("commit", GENERATION_DONE, ARTIFACT_COMMITTED, "artifact commit", "server",
          "worker: last frame -> WAV fsynced and renamed into place"),
    Phase("notify", ARTIFACT_COMMITTED, FINAL_RECEIVED, "final message", "network",
          "worker commit -> the client receives the job's final message"),
    Phase("client_gap", FINAL_RECEIVED, REQUEST_SENT, "client gap", "client",
          "client: final message -> artifact request issued"),
    Phase("request", REQUEST_SENT, REQUEST_RECEIVED, "request transit", "network",
          "artifact request sent -> received by the worker's handler"),
    Phase("server_first_byte", REQUEST_RECEIVED, FIRST_BYTE_SENT, "server first byte", "server",
          "worker: request received -> file opened, first chunk handed to gRPC"),
    Phase("first_byte_transit", FIRST_BYTE_SENT, FIRST_BYTE_RECEIVED, "first byte transit", "network",
          "the response's first message (header) sent -> received by the client: the one-way latency"),
    Phase("transfer", FIRST_BYTE_RECEIVED, LAST_BYTE_RECEIVED, "transfer", "client",
          "first message received -> the stream's last message received (file bytes / time = MB/s)"),
    Phase("client_write", LAST_BYTE_RECEIVED, FILE_FSYNCED, "client write", "client",
          "every byte in -> file written, fsynced and verified"),
)
PHASE_NAMES: tuple[str, ...] = tuple(p.name for p in PHASES)
FETCH_PHASES: frozenset[str] = frozenset(PHASE_NAMES[PHASE_NAMES.index("request"):])  # request -> on disk
PHASES_BY_NAME: dict[str, Phase] = {p.name: p for p in PHASES}


@dataclass(frozen=True)
class Timeline:
    """One artifact retrieval: its events on the client clock and what was moved."""

    label: str  # e.g. the artifact id, or "artifact 2 / chunk 64 KiB"
    events: Mapping[str, int]  # event name -> client-clock ns (server events already mapped); missing = unknown
    clock_uncertainty_ns: int = 0  # the mapping's uncertainty (>= 0)
    file_bytes: int = 0  # bytes of the file delivered (uncompressed)
    wire_bytes: int = 0  # payload bytes that crossed the wire (compressed size if compressed)
    chunk_size: int = 0  # requested uncompressed bytes per chunk (0 = the worker's default)
    chunks: int = 0  # data messages received
    compression: str = "none"
    rtt_ns: int | None = None  # the fastest clock-exchange round trip (a measure of the path's RTT)
    resumes: int = 0  # how many times the fetch resumed after a broken stream
    write_during_transfer_ns: int = 0  # client time inside write calls between first and last byte
    first_chunk_bytes: int = 0  # file bytes in the first message (0 from a header-only first message; bytes
    # that come with it arrive before the transfer phase starts)
    parallel: int = 1  # fetches that shared the artifact channel at the same time (this one included)
    extra: Mapping[str, object] = field(default_factory=dict)  # free-form facts (e.g. run index, config)
    event_uncertainty_ns: Mapping[str, int] = field(default_factory=dict)  # worker event -> its mapping's ±
    # phase (or "total", "waited") -> why it is not measured; "event:<name>" -> why an event's place on the
    # client clock is unknown (its duration-only phases still stand)
    unmeasured: Mapping[str, str] = field(default_factory=dict)
    evidence: Mapping[str, int] = field(default_factory=dict)  # see EVIDENCE
    clock: Mapping[str, object] = field(default_factory=dict)  # the clock check (clockcheck.ClockCheck.to_dict)

    def event(self, name: str) -> int | None:
        return self.events.get(name)

    def uncertainty_of(self, event: str) -> int:
        """The clock mapping's ± on a worker event (0 for client events)."""
        if event not in SERVER_EVENTS:
            return 0
        return int(self.event_uncertainty_ns.get(event, self.clock_uncertainty_ns))

    @property
    def clock_status(self) -> str:
        return str(self.clock.get("status", "ok"))

    @property
    def clock_evidence(self) -> tuple[str, ...]:
        """The clock check's evidence lines (none when it found nothing or did not run)."""
        lines = self.clock.get("evidence") or ()
        return tuple(str(line) for line in lines) if isinstance(lines, (list, tuple)) else ()

    @property
    def client_clock_evidence(self) -> tuple[str, ...]:
        """Steps of this client's wall clock during the run (`clockcheck.client_steps`); they move no phase."""
        lines = self.clock.get("client_evidence") or ()
        return tuple(str(line) for line in lines) if isinstance(lines, (list, tuple)) else ()

    def placed(self, event: str) -> bool:
        """Whether the event's place on the client clock is known (not merely its distance to its neighbours)."""
        return event in self.events and f"event:{event}" not in self.unmeasured

    def run_span_ns(self, phase: str | None = None) -> int | None:
        """How long the client saw the run that holds `phase` take: the fetch (request -> on disk) for the
        fetch's phases, the whole job (Synthesize call -> on disk) for the others; None if unknown."""
        end = self.events.get(FILE_FSYNCED)
        start = self.events.get(REQUEST_SENT) if phase in FETCH_PHASES else self.evidence.get("job_request_sent")
        return None if start is None or end is None else int(end) - int(start)

    def to_dict(self) -> dict:
        return {
            "label": self.label, "events_ns": {k: self.events[k] for k in EVENTS if k in self.events},
            "clock_uncertainty_ns": self.clock_uncertainty_ns, "file_bytes": self.file_bytes,
            "wire_bytes": self.wire_bytes, "chunk_size": self.chunk_size, "chunks": self.chunks,
            "compression": self.compression, "rtt_ns": self.rtt_ns, "resumes": self.resumes,
            "write_during_transfer_ns": self.write_during_transfer_ns, "first_chunk_bytes": self.first_chunk_bytes,
            "parallel": self.parallel,
            "extra": dict(self.extra), "event_uncertainty_ns": dict(self.event_uncertainty_ns),
            "unmeasured": dict(self.unmeasured), "evidence": dict(self.evidence), "clock": dict(self.clock),
        }


def map_timeline(label: str, client_events: Mapping[str, int], server_events: Mapping[str, int], *,
                 offset_ns: int, uncertainty_ns: int, **facts) -> Timeline:
    """Build a Timeline from raw clocks: `offset_ns` = worker clock - client clock (clock.proto's formula)."""
    unknown = (set(client_events) | set(server_events)) - set(EVENTS)
    if unknown:
        raise ValueError(f"unknown retrieval events {sorted(unknown)}; the events are {list(EVENTS)}")
    misplaced = (set(client_events) & SERVER_EVENTS) | (set(server_events) - SERVER_EVENTS)
    if misplaced:
        raise ValueError(f"events {sorted(misplaced)} are on the wrong side (worker events: {sorted(SERVER_EVENTS)})")
    events = {k: int(v) for k, v in client_events.items() if v}
    events.update({k: int(v) - int(offset_ns) for k, v in server_events.items() if v})
    return Timeline(label=label, events=events, clock_uncertainty_ns=abs(int(uncertainty_ns)), **facts)


@dataclass(frozen=True)
class PhaseTime:
    """One phase of one retrieval."""

    phase: Phase
    duration_ns: int | None  # attributed time; None when unknown or not measurable (`why` says which)
    uncertainty_ns: int  # 0 for same-machine phases, the clock mapping's for crossing ones
    span_ns: int | None = None  # end event - start event (differs from duration_ns for transfer / client write)
    why: str | None = None  # why a phase with both events is not measured (a clock problem)

    @property
    def known(self) -> bool:
        return self.duration_ns is not None

    @property
    def below_uncertainty(self) -> bool:
        """True when the phase is too short to tell from the clock mapping's error."""
        duration = self.duration_ns
        return duration is not None and self.uncertainty_ns > 0 and abs(duration) <= self.uncertainty_ns

    @property
    def seconds(self) -> float | None:
        return None if self.duration_ns is None else self.duration_ns / 1e9


def _span_uncertainty(timeline: Timeline, start: str, end: str) -> int:
    if (start in SERVER_EVENTS) == (end in SERVER_EVENTS):
        return 0
    return timeline.uncertainty_of(start) + timeline.uncertainty_of(end)


def impossible(timeline: Timeline, value_ns: int, uncertainty_ns: int, phase: str | None) -> str | None:
    """Why a span cannot be a measurement (None if it can): negative beyond its uncertainty, or longer than
    the run that holds it as the client saw it (`Timeline.run_span_ns`; phase None: no such bound)."""
    if value_ns < -uncertainty_ns:
        return f"impossible: it came out {format_seconds(value_ns / 1e9)} (a worker clock step or drift)"
    run = None if phase is None else timeline.run_span_ns(phase)
    if run is not None and value_ns > run + uncertainty_ns:
        return (f"impossible: it came out {format_seconds(value_ns / 1e9)}, longer than the whole run "
                f"({format_seconds(run / 1e9)}; a worker clock step or drift)")
    return None


def phase_times(timeline: Timeline) -> list[PhaseTime]:
    """The eight phases of one retrieval, in order."""
    out = []
    for phase in PHASES:
        a, b = timeline.event(phase.start), timeline.event(phase.end)
        span = None if a is None or b is None else b - a
        duration = span
        if span is not None and phase.name in ("transfer", "client_write"):
            moved = _write_overlap(timeline)
            duration = span - moved if phase.name == "transfer" else span + moved
        unc = _span_uncertainty(timeline, phase.start, phase.end)
        why = None
        if span is not None:
            why = timeline.unmeasured.get(phase.name) or impossible(timeline, span, unc, phase.name)
        if why is not None:
            duration = span = None
        out.append(PhaseTime(phase, duration, unc, span, why))
    return out


def _write_overlap(timeline: Timeline) -> int:
    """Write time inside the transfer span (bounded by the span, 0 if the span is unknown)."""
    a, b = timeline.event(FIRST_BYTE_RECEIVED), timeline.event(LAST_BYTE_RECEIVED)
    if a is None or b is None:
        return 0
    return max(0, min(timeline.write_during_transfer_ns, b - a))


def phases_dict(timeline: Timeline) -> dict:
    """One run's phases for JSON: attributed duration, raw span, uncertainty and the below-uncertainty label."""
    out: dict[str, dict[str, object]] = {}
    for pt in phase_times(timeline):
        out[pt.phase.name] = {
            "duration_s": pt.seconds, "span_s": None if pt.span_ns is None else pt.span_ns / 1e9,
            "uncertainty_s": pt.uncertainty_ns / 1e9, "below_uncertainty": pt.below_uncertainty,
        }
    for name, value in (("total", total_ns(timeline)), ("waited", waited_ns(timeline))):
        unc = _span_uncertainty(timeline, GENERATION_DONE if name == "total" else ARTIFACT_COMMITTED,
                                FILE_FSYNCED) / 1e9
        out[name] = {"duration_s": None if value is None else value / 1e9, "uncertainty_s": unc,
                     "below_uncertainty": value is not None and unc > 0 and abs(value) / 1e9 <= unc,
                     "why": _cross_span(timeline, name)[1]}
    if (rate := transfer_rate(timeline)) is not None:
        out["transfer"]["mb_per_s"] = rate / 1e6
    if (rate := delivery_rate(timeline)) is not None:
        out["transfer"]["delivered_mb_per_s"] = rate / 1e6
    for pt in phase_times(timeline):
        if pt.why:
            out[pt.phase.name]["why"] = pt.why
    return out


_CROSS_SPANS = {"total": (GENERATION_DONE, FILE_FSYNCED), "waited": (ARTIFACT_COMMITTED, REQUEST_SENT)}


def _cross_span(timeline: Timeline, name: str) -> tuple[int | None, str | None]:
    start, end = _CROSS_SPANS[name]
    a, b = timeline.event(start), timeline.event(end)
    if a is None or b is None:
        return None, None
    why = timeline.unmeasured.get(name) or impossible(timeline, b - a, _span_uncertainty(timeline, start, end),
                                                      "total" if name == "total" else None)
    return (None, why) if why else (b - a, None)


def total_ns(timeline: Timeline) -> int | None:
    """Generation done -> file on disk (None if either end is unknown or the span cannot be a measurement);
    uncertain by the clock mapping's ± on generation done."""
    return _cross_span(timeline, "total")[0]


def waited_ns(timeline: Timeline) -> int | None:
    """Artifact committed -> artifact requested: how long the file sat committed before anyone asked for it
    (for existing artifacts, the delay the user sees; for jobs, final message + client gap)."""
    return _cross_span(timeline, "waited")[0]


def fetch_ns(timeline: Timeline) -> int | None:
    """Artifact request sent -> file on disk: client clock only (None if either end is unknown)."""
    a, b = timeline.event(REQUEST_SENT), timeline.event(FILE_FSYNCED)
    return None if a is None or b is None else b - a


def _rate(timeline: Timeline, index: int, nbytes: int) -> float | None:
    duration = phase_times(timeline)[index].duration_ns
    if duration is None or duration <= 0 or nbytes <= 0:
        return None
    return nbytes / (duration / 1e9)


def transfer_bytes(timeline: Timeline) -> int:
    """File bytes that arrived during the transfer phase (all but those in the first message)."""
    return max(0, timeline.file_bytes - timeline.first_chunk_bytes)


def transfer_rate(timeline: Timeline) -> float | None:
    """File bytes per second over the transfer phase, client write time excluded (None if unknown)."""
    return _rate(timeline, PHASE_NAMES.index("transfer"), transfer_bytes(timeline))


def delivery_rate(timeline: Timeline) -> float | None:
    """File bytes per second from the worker's first byte sent to the client's last byte received: what the
    path delivered, through any buffer on it (crosses the clocks; None if unknown or not measurable)."""
    a, b = timeline.event(FIRST_BYTE_SENT), timeline.event(LAST_BYTE_RECEIVED)
    if a is None or b is None or b <= a or timeline.unmeasured.get("first_byte_transit"):
        return None
    return timeline.file_bytes / ((b - a) / 1e9) if timeline.file_bytes else None


def write_rate(timeline: Timeline) -> float | None:
    """File bytes per second over the client write phase (writes during the transfer included)."""
    return _rate(timeline, PHASE_NAMES.index("client_write"), timeline.file_bytes)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    """p50 / p95 / max of one phase (or the total) over several retrievals, in seconds."""

    name: str
    count: int
    p50_s: float | None
    p95_s: float | None
    max_s: float | None
    uncertainty_s: float  # the largest mapping uncertainty among the runs (0 for same-machine phases)
    below_uncertainty: bool  # the p50 is within the uncertainty

    def to_dict(self) -> dict:
        return {"name": self.name, "count": self.count, "p50_s": self.p50_s, "p95_s": self.p95_s,
                "max_s": self.max_s, "uncertainty_s": self.uncertainty_s,
                "below_uncertainty": self.below_uncertainty}


def summarize(name: str, seconds: Iterable[float | None], uncertainty_s: float = 0.0) -> Summary:
    values = [v for v in seconds if v is not None]
    if not values:
        return Summary(name, 0, None, None, None, uncertainty_s, False)
    p50 = percentile(values, 50)
    return Summary(name, len(values), p50, percentile(values, 95), max(values), uncertainty_s,
                   uncertainty_s > 0 and abs(p50) <= uncertainty_s)


def summarize_phases(timelines: Sequence[Timeline]) -> dict[str, Summary]:
    """Per-phase p50/p95/max over the runs (measured values only), plus "total" (generation done -> file on
    disk) and "waited" (commit -> request), which cross the clocks and carry the runs' largest uncertainty."""
    per_run = [phase_times(t) for t in timelines]
    out: dict[str, Summary] = {}
    for i, phase in enumerate(PHASES):
        times = [run[i] for run in per_run]
        unc = max((pt.uncertainty_ns for pt in times if pt.known), default=0) / 1e9
        out[phase.name] = summarize(phase.name, (pt.seconds for pt in times), unc)
    for name, fn in (("total", total_ns), ("waited", waited_ns)):
        values = [fn(t) for t in timelines]
        start, end = _CROSS_SPANS[name]
        unc = max((_span_uncertainty(t, start, end) for t, v in zip(timelines, values) if v is not None),
                  default=0) / 1e9
        out[name] = summarize(name, (None if v is None else v / 1e9 for v in values), unc)
    return out


def format_seconds(s: float | None) -> str:
    """Human duration: 3 min 05.0 s, 1.23 s, 45.6 ms, 789 us, or '-' when unknown."""
    if s is None:
        return "-"
    a = abs(s)
    if a >= 60.0:
        minutes, seconds = divmod(round(a, 1), 60)
        return f"{'-' if s < 0 else ''}{int(minutes)} min {seconds:04.1f} s"
    if a >= 1.0:
        return f"{s:.2f} s"
    if a >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def format_phase_value(summary_value: float | None, uncertainty_s: float) -> str:
    """A duration, labelled `< +-U` when it is within the clock mapping's uncertainty U."""
    if summary_value is None:
        return "-"
    if uncertainty_s > 0 and abs(summary_value) <= uncertainty_s:
        return f"<±{format_seconds(uncertainty_s)}"
    return format_seconds(summary_value)
