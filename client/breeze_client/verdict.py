"""The verdict on a set of retrievals: which phase dominates, the evidence, and the fix it points to.

Pure functions over `phases.Timeline` records. The causes come from the usual reasons a result arrives
long after the GPU finished: polling, shared-storage lag, payload encoding, per-file overhead, teardown,
cold start, bandwidth- or window-limited transfer, a slow client disk. Each phase has its own rule that
picks among the causes that can show up in it, from what the timestamps and byte counts say.

A retrieval whose p50 (generation done -> file on disk; request -> file on disk for existing artifacts,
whose generation time is unknown) is within `HEALTHY_BUDGET_S` is healthy: the longest phase is still
named, with its evidence, but the cause is `none` rather than a fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from breeze_client.phases import (
    PHASES_BY_NAME, PHASE_NAMES, Summary, Timeline, fetch_ns, format_seconds, percentile, summarize,
    summarize_phases, transfer_bytes, transfer_rate, write_rate,
)

DEFAULT_HTTP2_WINDOW = 64 * 1024  # gRPC's initial HTTP/2 stream window before BDP probing grows it
SMALL_CHUNK = 32 * 1024  # below this, per-message overhead dominates in Python gRPC
# a retrieval (one file, generation done -> on disk) within this is healthy: the loopback target for all
# three files of a user's batch
HEALTHY_BUDGET_S = 0.150

# cause key -> (what it is, the fix)
CATALOGUE: dict[str, tuple[str, str]] = {
    "storage_lag": ("the worker commits or opens artifacts slowly: shared or network storage (NFS, synced "
                    "mounts, volumes needing a commit) or a contended disk",
                    "keep --artifact-dir on the worker's local disk and fetch from the worker that wrote the "
                    "file over the artifact channel, instead of reading a shared mount"),
    "teardown": ("the result is published only after the job's process tears down (CUDA context reclaim)",
                 "commit the artifact as generation ends in a long-lived worker; do not wait for process exit"),
    "polling": ("the job-done notice is delivered late: a polling loop or a buffering intermediary sits between "
                "the worker and the client",
                "read the Synthesize stream's final message directly (no status polling); turn off response "
                "buffering in proxies on the path"),
    "cold_start": ("the client starts retrieval late: a fresh process or a new connection per retrieval",
                   "fetch as soon as the final message arrives, on an artifact channel opened in advance and kept "
                   "warm with keepalive"),
    "per_file_overhead": ("each file pays fixed round trips before its bytes flow (per-file transfer overhead)",
                          "fetch the files in parallel over one warm channel so the round trips overlap"),
    "network_latency": ("the path's latency: messages take the one-way delay to cross",
                        "overlap round trips (parallel fetches, fetch on the final message) or move the client "
                        "closer to the worker"),
    "payload_encoding": ("the payload is inflated on the wire (base64/JSON-style encoding)",
                         "send raw bytes (the artifact channel's bytes fields), optionally zstd"),
    "per_message_overhead": ("chunks are small, so per-message overhead dominates the transfer",
                             "raise --chunk-size to 256 KiB - 1 MiB"),
    "window_limited": ("the transfer is window-limited: the HTTP/2 flow-control window / RTT caps the rate",
                       "let BDP probing grow the window (no fixed small window), raise the artifact channel's "
                       "initial window, or fetch the files in parallel"),
    "connection_drops": ("the connection broke mid-transfer and the fetch resumed on a new one",
                         "find what cuts long transfers (proxy or load-balancer idle and size limits, keepalive "
                         "settings, an unstable link); resumable fetch recovers, but every break costs a reconnect"),
    "bandwidth": ("the transfer runs at the path's bandwidth",
                  "move fewer bytes (zstd compression, or s16le rather than f32le) or use a faster link"),
    "slow_client_disk": ("the client's disk writes slowly (network or synced folder, contended disk)",
                         "write the files to a fast local disk, then move them"),
    "none": ("the retrieval path is healthy: no phase is measurably slow", "nothing to fix in the retrieval path"),
}


@dataclass(frozen=True)
class Verdict:
    phase: str  # the dominant phase's name (PHASE_NAMES)
    title: str
    p50_s: float
    share: float  # the phase's p50 / the total's p50
    cause: str  # a CATALOGUE key
    explanation: str
    fix: str
    evidence: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"phase": self.phase, "title": self.title, "p50_s": self.p50_s, "share": self.share,
                "cause": self.cause, "explanation": self.explanation, "fix": self.fix,
                "evidence": list(self.evidence)}


@dataclass(frozen=True)
class Diagnosis:
    summaries: dict[str, Summary]  # per phase + "total"
    verdict: Verdict
    runs: int

    def to_dict(self) -> dict:
        return {"runs": self.runs, "phases": {k: v.to_dict() for k, v in self.summaries.items()},
                "verdict": self.verdict.to_dict()}


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return percentile(vals, 50) if vals else None


def _rtt_s(timelines: Sequence[Timeline]) -> float | None:
    return _median([t.rtt_ns / 1e9 if t.rtt_ns else None for t in timelines])


def diagnose(timelines: Sequence[Timeline]) -> Diagnosis:
    """Summarize the runs and name the dominant phase, with its evidence and fix."""
    if not timelines:
        raise ValueError("diagnose needs at least one retrieval timeline")
    summaries = summarize_phases(timelines)
    ranked = sorted(PHASE_NAMES, key=lambda n: (summaries[n].p50_s or 0.0, summaries[n].max_s or 0.0),
                    reverse=True)
    name = ranked[0]
    s = summaries[name]
    whole, whole_label = _retrieval(timelines, summaries)
    total = whole or sum(max(summaries[n].p50_s or 0.0, 0.0) for n in PHASE_NAMES)
    share = (s.p50_s or 0.0) / total if total > 0 else 0.0
    cause, evidence = _RULES[name](timelines, summaries)
    evidence = [f"{PHASES_BY_NAME[name].title} p50 {format_seconds(s.p50_s)} (p95 {format_seconds(s.p95_s)}, "
                f"max {format_seconds(s.max_s)}) = {share:.0%} of {whole_label} p50 {format_seconds(whole)} "
                f"over {len(timelines)} run(s)"] + evidence
    if whole is not None and whole <= HEALTHY_BUDGET_S:
        evidence.append(f"the whole retrieval ({whole_label} p50 {format_seconds(whole)}) is within the "
                        f"{format_seconds(HEALTHY_BUDGET_S)} budget: the retrieval path is healthy")
        cause = "none"
    if s.below_uncertainty:
        evidence.append(f"it is within the clock mapping's uncertainty (±{format_seconds(s.uncertainty_s)}): "
                        "no phase is measurably slow")
        cause = "none"
    explanation, fix = CATALOGUE[cause]
    verdict = Verdict(name, PHASES_BY_NAME[name].title, s.p50_s or 0.0, share, cause, explanation, fix,
                      tuple(evidence))
    return Diagnosis(summaries, verdict, len(timelines))


def _retrieval(timelines: Sequence[Timeline], summaries: dict[str, Summary]) -> tuple[float | None, str]:
    """The whole retrieval's p50 and what it spans: from generation done when that is known, else from the
    artifact request (existing artifacts were generated at some unknown earlier time)."""
    total = summaries["total"].p50_s
    if total is not None:
        return total, "generation-done -> on-disk"
    fetch = summarize("fetch", [None if (v := fetch_ns(t)) is None else v / 1e9 for t in timelines]).p50_s
    return fetch, "request -> on-disk (generation done is unknown for existing artifacts)"


# ---- one rule per phase: (cause, evidence lines) ----

def _commit(timelines, summaries):
    p50 = summaries["commit"].p50_s or 0.0
    sizes = _median([float(t.file_bytes) for t in timelines]) or 0.0
    rate = sizes / p50 / 1e6 if p50 > 0 else None
    ev = [f"the worker took {format_seconds(p50)} from the last frame to a committed {sizes / 1e6:.2f} MB WAV"
          + (f" ({rate:.1f} MB/s through fsync + rename)" if rate else "")]
    if p50 > 5.0:
        ev.append("seconds between generation and commit look like a publish-after-exit (teardown) pattern")
        return "teardown", ev
    return "storage_lag", ev


def _notify(timelines, summaries):
    p50, rtt = summaries["notify"].p50_s or 0.0, _rtt_s(timelines)
    ev = [f"the final message reached the client {format_seconds(p50)} after the commit"]
    if rtt is not None:
        ev.append(f"the path's round trip (clock exchange) is {format_seconds(rtt)}")
        if p50 <= max(rtt, 0.002) * 1.5:
            return "network_latency", ev
    return "polling", ev


def _client_gap(timelines, summaries):
    gaps = [t.event("request_sent") - t.event("final_received") for t in timelines
            if t.event("request_sent") is not None and t.event("final_received") is not None]
    ev = [f"the client waited {format_seconds(summaries['client_gap'].p50_s)} between the final message and its "
          "artifact request"]
    if len(gaps) >= 3:
        spread = (max(gaps) - min(gaps)) / 1e9
        if spread > 0.5 * (percentile(gaps, 50) / 1e9):
            ev.append(f"the gap varies by {format_seconds(spread)} across runs, as a polling interval does")
            return "polling", ev
    return "cold_start", ev


def _request(timelines, summaries):
    p50, rtt = summaries["request"].p50_s or 0.0, _rtt_s(timelines)
    ev = [f"the request took {format_seconds(p50)} to reach the worker's handler"]
    if rtt is not None:
        ev.append(f"one-way delay from the clock exchange is about {format_seconds(rtt / 2)}")
        if p50 > 2 * rtt + 0.005:
            ev.append("much longer than the path's one-way delay: connection set-up on the request path")
            return "cold_start", ev
    return "per_file_overhead" if len(timelines) > 1 else "network_latency", ev


def _server_first_byte(timelines, summaries):
    p50 = summaries["server_first_byte"].p50_s or 0.0
    return "storage_lag", [f"the worker took {format_seconds(p50)} from receiving the request to its first "
                           "message (file open and check)"]


def _first_byte_transit(timelines, summaries):
    p50, rtt = summaries["first_byte_transit"].p50_s or 0.0, _rtt_s(timelines)
    first = _median([float(t.first_chunk_bytes) for t in timelines]) or 0.0
    ev = [f"the response's first message ({first / 1024:.0f} KiB of file data) took {format_seconds(p50)} "
          "from the worker to the client"]
    if rtt is not None:
        one_way = rtt / 2
        ev.append(f"one-way delay from the clock exchange is about {format_seconds(one_way)}")
        # a first message that carried file bytes and took far longer than the one-way delay: those bytes
        # were moving at the path's rate, so the transfer rule applies to them
        if first > 0 and p50 > 2 * one_way + 0.005:
            rate = first / (p50 - one_way)
            ev.append(f"much longer than the one-way delay: its {first / 1024:.0f} KiB moved at about "
                      f"{rate / 1e6:.2f} MB/s ({rate * 8 / 1e6:.1f} Mbit/s)")
            return _rate_cause(timelines, rate, rtt, ev), ev
    return ("per_file_overhead" if len(timelines) > 1 else "network_latency"), ev


def _transfer(timelines, summaries):
    rate = _median([transfer_rate(t) for t in timelines])
    size = _median([float(t.file_bytes) for t in timelines]) or 0.0
    wire = _median([float(t.wire_bytes) for t in timelines]) or 0.0
    chunks = _median([float(t.chunks) for t in timelines]) or 0.0
    rtt = _rtt_s(timelines)
    moved = _median([float(transfer_bytes(t)) for t in timelines]) or 0.0
    first = _median([float(t.first_chunk_bytes) for t in timelines]) or 0.0
    ev = [f"{moved / 1e6:.2f} MB of file data in {format_seconds(summaries['transfer'].p50_s)}"
          + (f" = {rate / 1e6:.2f} MB/s ({rate * 8 / 1e6:.1f} Mbit/s)" if rate else "")
          + (f" (after the {first / 1024:.0f} KiB that came with the first message)" if first else "")]
    if chunks:
        ev.append(f"{chunks:.0f} chunk{'s' if chunks != 1 else ''} of ~{size / chunks / 1024:.0f} KiB, compression "
                  f"{timelines[0].compression}, {wire / 1e6:.2f} MB on the wire")
    resumes = sum(t.resumes for t in timelines)
    if resumes:
        ev.append(f"the stream broke and resumed {resumes} time(s) in {len(timelines)} run(s)")
        return "connection_drops", ev
    if size and wire > 1.25 * size:
        ev.append(f"the wire carried {wire / size:.2f}x the file's bytes")
        return "payload_encoding", ev
    if chunks and size / chunks < SMALL_CHUNK and chunks >= 8:
        return "per_message_overhead", ev
    return _rate_cause(timelines, rate, rtt, ev), ev


def _rate_cause(timelines, rate: float | None, rtt: float | None, ev: list[str]) -> str:
    """bandwidth or window_limited, from a measured rate and the path's round trip (appends evidence)."""
    parallel = max(t.parallel for t in timelines)
    if rate and parallel > 1:
        ev.append(f"{parallel} fetches shared the path at once (this one's share: {rate / 1e6:.2f} MB/s)")
    if rate and rtt is not None:
        ev.append(f"round trip {format_seconds(rtt)}: {rate * rtt / 1024:.0f} KiB in flight per round trip"
                  + (" per fetch" if parallel > 1 else ""))
        # parallel fetches each have a stream window: only when all of them together keep about one window
        # in flight is the window (not the path) the limit; far less than a window in flight means the
        # sender was allowed more than the path carried
        in_flight = rate * rtt * parallel
        if rtt > 0.002 and 0.5 * DEFAULT_HTTP2_WINDOW <= in_flight <= 1.25 * DEFAULT_HTTP2_WINDOW:
            ev.append(f"that is about one {DEFAULT_HTTP2_WINDOW // 1024} KiB HTTP/2 window per round trip")
            return "window_limited"
    return "bandwidth"


def _client_write(timelines, summaries):
    rate = _median([write_rate(t) for t in timelines])
    ev = [f"writing and fsyncing the file took {format_seconds(summaries['client_write'].p50_s)}"
          + (f" ({rate / 1e6:.1f} MB/s)" if rate else "")]
    return "slow_client_disk", ev


_RULES = {
    "commit": _commit, "notify": _notify, "client_gap": _client_gap, "request": _request,
    "server_first_byte": _server_first_byte, "first_byte_transit": _first_byte_transit,
    "transfer": _transfer, "client_write": _client_write,
}
