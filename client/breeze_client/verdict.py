"""The verdict on a set of retrievals: which phase dominates, the cause the evidence names, and the fix.

The dominant phase is the one with the longest p50 over the runs (measured values only). Its cause is
decided per run by `causes.classify`, from the evidence the phase carries in that run (the worker's fsync,
read and send times, the client's CPU wait, rates against the path), and the runs vote: the same path
gives the same cause with one run or ten. A cause only several runs can tell from another says so.

A retrieval whose p50 (generation done -> file on disk; request -> file on disk for existing artifacts,
whose generation time is unknown) is within `HEALTHY_BUDGET_S` is healthy: the longest phase is still
named, with its evidence, but the cause is `none` rather than a fault. A run whose clock mapping the
clock check could not repair (`clockcheck`) has its cross-machine phases unmeasured; when that is most
runs, the cause is `clock_broken`, never "healthy".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from breeze_client.causes import classify
from breeze_client.phases import (
    PHASE_NAMES,
    PHASES_BY_NAME,
    PhaseTime,
    Summary,
    Timeline,
    fetch_ns,
    format_seconds,
    phase_times,
    summarize,
    summarize_phases,
)

# a retrieval (one file, generation done -> on disk) within this is healthy: the loopback target for all
# three files of a user's batch
HEALTHY_BUDGET_S = 0.150

# cause key -> (what it is, the fix: the setting or component to change)
CATALOGUE: dict[str, tuple[str, str]] = {
    "storage_write": ("the worker's artifact volume writes slowly: making the WAV durable (fsync) takes the time",
                      "put --artifact-dir (BREEZE_ARTIFACTS_DIRECTORY) on a fast local volume; a network or synced "
                      "mount that needs seconds or minutes to commit belongs after the fetch, not under the worker"),
    "storage_read": ("the worker's artifact volume reads slowly: opening or reading the WAV takes the time",
                     "serve --artifact-dir from a fast local volume (not a network mount or a throttled disk), and "
                     "fetch soon after the commit, while the file is still in the worker's page cache"),
    "worker_busy": ("the worker was slow around its storage calls: the time went by in the worker itself (a queue "
                    "behind other commits, a busy or CPU-starved worker process)",
                    "give the worker CPU headroom (its container or cgroup CPU limit, other work on the host) and "
                    "check its log for stalls; the storage calls themselves were quick"),
    "polling": ("the job-done notice is delivered late: a polling loop or an intermediary holds it between the "
                "worker and the client",
                "read the Synthesize stream's final message directly (no status polling) and turn off response "
                "buffering in proxies on the synthesis path"),
    "buffering_intermediary": ("an intermediary buffers the response: the first byte arrives together with the "
                               "last, after the whole file crossed the path",
                               "turn off response buffering in the proxy or gateway on the artifact path (e.g. "
                               "nginx grpc_buffer_size / proxy_buffering off) or point --artifact-target at the "
                               "worker's artifact port directly"),
    "cold_start": ("the client starts retrieval late: a fresh process or a new connection per retrieval",
                   "fetch as soon as the final message arrives, on an artifact channel opened in advance and kept "
                   "warm with keepalive"),
    "network_latency": ("the path's latency: each file pays the round trips before its bytes flow",
                        "overlap the round trips (fetch the files in parallel over one warm channel, fetch on the "
                        "final message) or move the client closer to the worker"),
    "payload_encoding": ("the payload is inflated on the wire (base64/JSON-style encoding)",
                         "send raw bytes (the artifact channel's bytes fields), optionally zstd"),
    "per_message_overhead": ("chunks are small, so per-message overhead dominates the transfer",
                             "raise the fetch chunk size (--chunk-sizes 256k or 1m)"),
    "window_limited": ("the transfer is window-limited: the HTTP/2 flow-control window / RTT caps the rate below "
                       "what the link carries",
                       "let BDP probing grow the client's window (drop grpc.http2.bdp_probe=0 and a small "
                       "grpc.http2.lookahead_bytes from the channel options), raise the chunk size, or fetch the "
                       "files in parallel (--parallel)"),
    "connection_drops": ("the connection broke mid-transfer and the fetch resumed on a new one",
                         "find what cuts long transfers (proxy or load-balancer idle and size limits, keepalive "
                         "settings, an unstable link); resumable fetch recovers, but every break costs a reconnect"),
    "bandwidth": ("the transfer runs at the path's bandwidth",
                  "move fewer bytes (zstd compression, or s16le rather than f32le) or use a faster link"),
    "slow_client_disk": ("the client's disk writes slowly (network or synced folder, contended or throttled disk)",
                         "write the files to a fast local disk (--out-dir), then move them"),
    "client_cpu": ("the client is starved of CPU: its threads wait for a CPU while bytes wait to be read",
                   "give the client process CPU (its container or cgroup CPU quota, a less loaded host); the "
                   "worker and the path are not the limit"),
    "clock_broken": ("the clock mapping is broken: the worker's clock stepped or runs off against the client's, so "
                     "the phases that cross between the machines cannot be measured",
                     "keep the worker's and the client's clocks disciplined (chrony or NTP, no manual steps) and "
                     "run diagnose again; the phases measured on one machine still stand"),
    "none": ("the retrieval path is healthy: no phase is measurably slow", "nothing to fix in the retrieval path"),
}
SEVERITY: dict[str, str] = {"none": "ok", "clock_broken": "unknown"}  # every other cause: "fault"


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
    runs_by_cause: tuple[tuple[str, int], ...] = ()  # how the runs voted
    needs_runs: str | None = None  # what several runs would tell apart, when these cannot

    @property
    def severity(self) -> str:
        """ok (healthy), unknown (the clock mapping is broken) or fault."""
        return SEVERITY.get(self.cause, "fault")

    def to_dict(self) -> dict:
        return {"phase": self.phase, "title": self.title, "p50_s": self.p50_s, "share": self.share,
                "cause": self.cause, "severity": self.severity, "explanation": self.explanation, "fix": self.fix,
                "evidence": list(self.evidence), "runs_by_cause": dict(self.runs_by_cause),
                "needs_runs": self.needs_runs}


@dataclass(frozen=True)
class Diagnosis:
    summaries: dict[str, Summary]  # per phase + "total" + "waited"
    verdict: Verdict
    runs: int
    clock: tuple[str, ...] = ()  # each run's clock status (ok, drift, stepped, broken)

    def to_dict(self) -> dict:
        return {"runs": self.runs, "phases": {k: v.to_dict() for k, v in self.summaries.items()},
                "verdict": self.verdict.to_dict(), "clock": list(self.clock)}


def _median_run(timelines: Sequence[Timeline], phase: str
                ) -> tuple[list[tuple[Timeline, PhaseTime]], tuple[Timeline, PhaseTime] | None]:
    """The runs with `phase` measured, as (timeline, PhaseTime), and the one whose duration is the median."""
    index = PHASE_NAMES.index(phase)
    runs = [(t, phase_times(t)[index]) for t in timelines]
    measured = [(t, pt) for t, pt in runs if pt.known]
    # (duration, index) pairs: ties keep the runs' order, as a stable sort on the duration does
    ordered = sorted((pt.duration_ns, i) for i, (_, pt) in enumerate(measured) if pt.duration_ns is not None)
    return measured, measured[ordered[(len(ordered) - 1) // 2][1]] if ordered else None


def diagnose(timelines: Sequence[Timeline]) -> Diagnosis:
    """Summarize the runs, name the dominant phase, and let each run's evidence name its cause."""
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
    measured, median = _median_run(timelines, name)
    findings = [(t, classify(t, pt)) for t, pt in measured]
    votes = Counter(f.cause for _, f in findings)
    cause, rep = "none", None
    if findings:  # the majority; a tie goes to the median run's cause; its evidence is the median run's if it agrees
        top = max(votes.values())
        tied = [c for c, n in votes.items() if n == top]
        assert median is not None  # the findings are the measured runs', so there is a median run
        median_finding = next(f for t, f in findings if t is median[0])
        cause = median_finding.cause if median_finding.cause in tied else tied[0]
        rep = median_finding if median_finding.cause == cause else next(f for _, f in findings if f.cause == cause)
    evidence = [f"{PHASES_BY_NAME[name].title} p50 {format_seconds(s.p50_s)} (p95 {format_seconds(s.p95_s)}, "
                f"max {format_seconds(s.max_s)}) = {share:.0%} of {whole_label} p50 {format_seconds(whole)} "
                f"over {len(timelines)} run(s)"]
    evidence += rep.evidence if rep is not None else []
    if len(votes) > 1:
        evidence.append("causes by run: " + ", ".join(f"{c} x{n}" for c, n in votes.most_common()))
    waited = summaries["waited"]
    if waited.p50_s is not None and whole is not None and waited.p50_s > whole and "generation done is unknown" \
            in whole_label:
        evidence.append(f"the file sat committed for {format_seconds(waited.p50_s)} (p50) before it was requested: "
                        "longer than the whole fetch, so look at when the client learns a job is done")
    statuses = tuple(t.clock_status for t in timelines)
    for i, t in enumerate(timelines):
        if t.clock_status != "ok":
            evidence += [f"run {i + 1} clock {t.clock_status}: {line}" for line in t.clock_evidence]
    broken = sum(1 for st in statuses if st == "broken")
    if whole is not None and whole <= HEALTHY_BUDGET_S and broken * 2 < len(timelines):
        evidence.append(f"the whole retrieval ({whole_label} p50 {format_seconds(whole)}) is within the "
                        f"{format_seconds(HEALTHY_BUDGET_S)} budget: the retrieval path is healthy")
        cause = "none"
    if s.below_uncertainty:
        evidence.append(f"it is within the clock mapping's uncertainty (±{format_seconds(s.uncertainty_s)}): "
                        "no phase is measurably slow")
        cause = "none"
    if broken * 2 >= len(timelines):
        evidence.append(f"{broken} of {len(timelines)} run(s) have a broken clock mapping: their cross-machine "
                        "phases are not measured, and the verdict cannot call the path healthy")
        cause = "clock_broken"
    explanation, fix = CATALOGUE[cause]
    needs = rep.needs_runs if rep is not None and cause == rep.cause else None
    verdict = Verdict(name, PHASES_BY_NAME[name].title, s.p50_s or 0.0, share, cause, explanation, fix,
                      tuple(evidence), tuple(votes.most_common()), needs)
    return Diagnosis(summaries, verdict, len(timelines), statuses)


def _retrieval(timelines: Sequence[Timeline], summaries: dict[str, Summary]) -> tuple[float | None, str]:
    """The whole retrieval's p50 and what it spans: from generation done when that is known, else from the
    artifact request (existing artifacts were generated at some unknown earlier time)."""
    total = summaries["total"].p50_s
    if total is not None:
        return total, "generation-done -> on-disk"
    if any("generation_done" in t.events for t in timelines):  # known, but not measurable
        measured = sum(max(summaries[n].p50_s or 0.0, 0.0) for n in PHASE_NAMES)
        return measured, "the measured phases (the total crosses the broken clock mapping)"
    fetch = summarize("fetch", [None if (v := fetch_ns(t)) is None else v / 1e9 for t in timelines]).p50_s
    return fetch, "request -> on-disk (generation done is unknown for existing artifacts)"
