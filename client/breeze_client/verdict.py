"""The verdict on a set of retrievals: which phase holds the time, the cause the evidence names, and the fix.

The dominant phase is the one with the longest p50 over the runs (measured values only). Its cause is
decided per run by `causes.classify`, from the evidence the phase carries in that run (the worker's fsync,
read and send times and its own wait for a CPU, the client's CPU wait, rates against the path), and the
runs vote: the same path gives the same cause with one run or ten. When no phase's p50 holds most of the
total (stalls that fall in a different phase in each run), each run's own longest phase speaks for it
instead. What only several runs can tell apart is settled from all of them where there are several (the
client gap: `gaps.py`), and said where there is one (`needs_runs`).

A retrieval whose p50 (generation done -> file on disk; request -> file on disk for existing artifacts,
whose generation time is unknown) is within `HEALTHY_BUDGET_S` is healthy: the cause is `none`, the
longest phase is still named with its measurement, and no rule's argument for a fault is kept in the
headline. A run whose clock mapping the clock check could not repair (`clockcheck`) has its cross-machine
phases unmeasured; when that is most runs, the cause is `clock_broken`, never "healthy".

The verdict's evidence is a headline of at most `MAX_HEADLINE` lines (what the cause rests on) and its
details (per-run clock findings, how the runs voted, the rule's argument when the verdict overrode it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from breeze_client.causes import Finding, classify
from breeze_client.gaps import Gap
from breeze_client.gaps import across_runs as gaps_across_runs
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
DOMINANT_SHARE = 0.5  # a phase whose p50 holds less of the total's leaves each run's longest phase to speak
MAX_HEADLINE = 4  # evidence lines in the verdict's headline; the rest are its details

# cause key -> (what it is, the fix: the setting or component to change)
CATALOGUE: dict[str, tuple[str, str]] = {
    "storage_write": ("the worker's artifact volume writes slowly: making the WAV durable (fsync) takes the time",
                      "put --artifact-dir (BREEZE_ARTIFACTS_DIRECTORY) on a fast local volume; a network or synced "
                      "mount that needs seconds or minutes to commit belongs after the fetch, not under the worker"),
    "storage_read": ("the worker's artifact volume reads slowly: opening or reading the WAV takes the time",
                     "serve --artifact-dir from a fast local volume (not a network mount or a throttled disk), and "
                     "fetch soon after the commit, while the file is still in the worker's page cache"),
    "worker_busy": ("the worker was slow around its storage calls or its sends: the time went by in the worker "
                    "itself, not in its storage and not waiting for a CPU (a queue behind other commits, a stall; "
                    "a worker that does not report its CPU wait may also be starved of CPU)",
                    "check the worker's log for stalls and slow engine steps, and its load (other jobs, its "
                    "container's CPU limit); the storage calls themselves were quick"),
    "worker_cpu": ("the worker is starved of CPU: its threads waited for a CPU (a CPU quota on its container or "
                   "cgroup, or other work on its host) while the request waited on them",
                   "give the worker CPU: raise its container's or cgroup's CPU limit, or move other work off its "
                   "host; the volume and the network path are not the limit"),
    "polling": ("the job-done notice reaches the fetch late: a polling loop (in the application, or an "
                "intermediary on the synthesis path) passes it on only at its next poll",
                "fetch on the Synthesize stream's final message instead of polling for finished jobs (or poll "
                "more often), and turn off response buffering in proxies on the synthesis path"),
    "buffering_intermediary": ("an intermediary buffers the response: the first byte arrives together with the "
                               "last, after the whole file crossed the path",
                               "turn off response buffering in the proxy or gateway on the artifact path (e.g. "
                               "nginx grpc_buffer_size / proxy_buffering off) or point --artifact-target at the "
                               "worker's artifact port directly"),
    "cold_start": ("the client starts retrieval late: it opens a fresh client or connection per retrieval, and "
                   "sets it up after the job is done",
                   "keep one client (BreezeClient) for the application's life: its artifact channel opens and "
                   "exchanges clocks once, and each fetch goes out as soon as the final message arrives"),
    "client_delay": ("the client application waits before it fetches: a fixed delay between the final message "
                     "and its artifact request (or, with one run, possibly a polling loop)",
                     "fetch as soon as the final message arrives (SynthesisResult.artifact holds what to fetch); "
                     "drop the sleep, timer or batch window in front of the fetch"),
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
    "none": ("the retrieval path is healthy: nothing in it is measurably slow", "nothing to fix in the retrieval path"),
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
    details: tuple[str, ...] = ()  # evidence beyond the headline (`evidence`, at most MAX_HEADLINE lines)

    @property
    def severity(self) -> str:
        """ok (healthy), unknown (the clock mapping is broken) or fault."""
        return SEVERITY.get(self.cause, "fault")

    def to_dict(self) -> dict:
        return {"phase": self.phase, "title": self.title, "p50_s": self.p50_s, "share": self.share,
                "cause": self.cause, "severity": self.severity, "explanation": self.explanation, "fix": self.fix,
                "evidence": list(self.evidence), "runs_by_cause": dict(self.runs_by_cause),
                "needs_runs": self.needs_runs, "details": list(self.details)}


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
    """Summarize the runs, find the phase that holds the time, and let each run's evidence name its cause."""
    if not timelines:
        raise ValueError("diagnose needs at least one retrieval timeline")
    summaries = summarize_phases(timelines)
    whole, whole_label = _retrieval(timelines, summaries)
    total = whole or sum(max(summaries[n].p50_s or 0.0, 0.0) for n in PHASE_NAMES)
    vote = _vote(timelines, summaries, total)
    s = summaries[vote.phase]
    share = (s.p50_s or 0.0) / total if total > 0 else 0.0
    summary = (f"{PHASES_BY_NAME[vote.phase].title} p50 {format_seconds(s.p50_s)} (p95 {format_seconds(s.p95_s)}, "
               f"max {format_seconds(s.max_s)}) = {share:.0%} of {whole_label} p50 {format_seconds(whole)} "
               f"over {len(timelines)} run(s)")
    ev = list(vote.rep.evidence) if vote.rep is not None else []
    first = [summary] + ev[:1] + ev[-1:] * (len(ev) > 1)  # the measurement, and the comparison that named the cause
    more: list[str] = []  # in the headline while there is room, then the details
    details: list[str] = []
    if vote.wandering and vote.findings:
        index = {id(t): i for i, t in enumerate(timelines)}
        longest = ", ".join(f"run {index[id(t)] + 1}: {pt.phase.title} {format_seconds(pt.seconds)}"
                            for t, pt, _ in vote.findings)
        more.append(f"no phase holds most of the time: each run's longest phase differs ({longest})")
    more += ev[1:-1]
    if len(vote.counts) > 1:
        details.append("causes by run: " + ", ".join(f"{c} x{n}" for c, n in vote.counts.most_common()))
    waited = summaries["waited"]
    if waited.p50_s is not None and whole is not None and waited.p50_s > whole and "generation done is unknown" \
            in whole_label:
        more.append(f"the file sat committed for {format_seconds(waited.p50_s)} (p50) before it was requested: "
                    "longer than the whole fetch, so look at when the client learns a job is done")
    statuses = tuple(t.clock_status for t in timelines)
    clock_lines = _clock_lines(timelines)
    cause, overridden = _overridden(vote.cause, timelines, s, summary, whole, whole_label, clock_lines)
    if overridden is not None:  # the rule's measurement stays, not its argument for a cause not named
        first, more = overridden + ev[:1], []
    if clock_lines and cause != "clock_broken":
        more.append(_clock_summary(timelines))
    room = max(0, MAX_HEADLINE - len(first))
    headline, details = first + more[:room], more[room:] + details + clock_lines
    explanation, fix = CATALOGUE[cause]
    needs = vote.rep.needs_runs if vote.rep is not None and cause == vote.rep.cause else None
    verdict = Verdict(vote.phase, PHASES_BY_NAME[vote.phase].title, s.p50_s or 0.0, share, cause, explanation, fix,
                      tuple(headline), tuple(vote.counts.most_common()), needs, tuple(details))
    return Diagnosis(summaries, verdict, len(timelines), statuses)


@dataclass
class _Vote:
    phase: str  # the phase whose findings the verdict reports
    wandering: bool  # no phase's p50 held most of the total: each run's longest phase spoke for it
    findings: list[tuple[Timeline, PhaseTime, Finding]]
    counts: Counter
    cause: str
    rep: Finding | None  # the finding whose evidence the verdict shows


def _vote(timelines: Sequence[Timeline], summaries: dict[str, Summary], total: float) -> _Vote:
    """Each run's finding for the phase that holds the time (its own longest phase, when no phase's p50 holds
    most of the total), the client gaps settled across runs, and the majority with its representative."""
    ranked = sorted(PHASE_NAMES, key=lambda n: (summaries[n].p50_s or 0.0, summaries[n].max_s or 0.0),
                    reverse=True)
    name = ranked[0]
    share = (summaries[name].p50_s or 0.0) / total if total > 0 else 0.0
    wandering = len(timelines) > 1 and share < DOMINANT_SHARE
    median_run = None
    if wandering:
        picks = [(t, pt) for t in timelines if (pt := _longest(t)) is not None]
    else:
        picks, median = _median_run(timelines, name)
        median_run = median[0] if median is not None else None
    findings = across_runs([(t, pt, classify(t, pt)) for t, pt in picks])
    counts = Counter(f.cause for _, _, f in findings)
    if not findings:
        return _Vote(name, wandering, findings, counts, "none", None)
    # the majority; a tie goes to the median run's cause; its evidence is the median run's if it agrees
    top = max(counts.values())
    tied = [c for c, n in counts.items() if n == top]
    median_finding = next((f for t, _, f in findings if t is median_run), findings[0][2])
    cause = median_finding.cause if median_finding.cause in tied else tied[0]
    rep = median_finding if median_finding.cause == cause else next(f for _, _, f in findings if f.cause == cause)
    if wandering:  # the phase the runs that named the cause most often had as their longest, and its finding
        name = Counter(pt.phase.name for _, pt, f in findings if f.cause == cause).most_common(1)[0][0]
        rep = next(f for _, pt, f in findings if f.cause == cause and pt.phase.name == name)
    return _Vote(name, wandering, findings, counts, cause, rep)


def _overridden(cause: str, timelines: Sequence[Timeline], s: Summary, summary: str, whole: float | None,
                whole_label: str, clock_lines: list[str]) -> tuple[str, list[str] | None]:
    """(the verdict's cause, its headline when that is not the rule's: healthy, or the clock mapping broken)."""
    broken = sum(1 for t in timelines if t.clock_status == "broken")
    if broken * 2 >= len(timelines):
        return "clock_broken", [f"{broken} of {len(timelines)} run(s) have a broken clock mapping: their "
                                "cross-machine phases are not measured, and the verdict cannot call the path healthy",
                                f"of what could be measured: {summary}"] + clock_lines[:1]
    if s.below_uncertainty:
        return "none", [summary, f"it is within the clock mapping's uncertainty (±{format_seconds(s.uncertainty_s)}): "
                                 "no phase is measurably slow"]
    if whole is not None and whole <= HEALTHY_BUDGET_S:
        return "none", [f"the whole retrieval ({whole_label} p50 {format_seconds(whole)}) is within the "
                        f"{format_seconds(HEALTHY_BUDGET_S)} budget: the retrieval path is healthy",
                        f"its longest phase: {summary}"]
    return cause, None


def _longest(t: Timeline) -> PhaseTime | None:
    """The run's longest measured phase (None when none is measured)."""
    known = [pt for pt in phase_times(t) if pt.known and pt.duration_ns is not None]
    return max(known, key=lambda pt: pt.duration_ns or 0) if known else None


def across_runs(findings: list[tuple[Timeline, PhaseTime, Finding]]) -> list[tuple[Timeline, PhaseTime, Finding]]:
    """The client-gap findings that one run could not settle (`client_delay` with `needs_runs`), settled from
    every such run's gap when there are two or more (`gaps.across_runs`): polling or a fixed delay."""
    open_gaps = [(t, f) for t, pt, f in findings if pt.phase.name == "client_gap" and f.needs_runs]
    gaps = [Gap(t.events["final_received"], t.events["request_sent"]) for t, _ in open_gaps]
    settled = gaps_across_runs(gaps)
    if settled is None:
        return findings
    cause, lines = settled
    decided = {id(f) for _, f in open_gaps}
    return [(t, pt, Finding(cause, f.evidence + lines) if id(f) in decided else f) for t, pt, f in findings]


def _clock_lines(timelines: Sequence[Timeline]) -> list[str]:
    """Every run's clock findings, the worker's and the client's, each named for the run."""
    out = []
    for i, t in enumerate(timelines):
        if t.clock_status != "ok":
            out += [f"run {i + 1} clock {t.clock_status}: {line}" for line in t.clock_evidence]
        out += [f"run {i + 1}: {line}" for line in t.client_clock_evidence]
    return out


def _clock_summary(timelines: Sequence[Timeline]) -> str:
    """One line for the headline: which side's clock moved in which runs (the details list each move)."""
    parts = []
    either = [f"run {i + 1}" for i, t in enumerate(timelines) if t.clock_status == "drift"
              and t.clock.get("drifted") == "either"]
    worker = [f"run {i + 1} {t.clock_status}" for i, t in enumerate(timelines) if t.clock_status != "ok"
              and f"run {i + 1}" not in either]
    if worker:
        parts.append("the worker's clock moved (" + ", ".join(worker) + "; stepped and drifting runs were re-mapped "
                     "from the exchanges that agree with the order of events)")
    if either:
        parts.append("the worker's clock and this client's drifted apart (" + ", ".join(either) + "; the mapping's "
                     "uncertainty was widened by the drift; this client's clock is not known to be disciplined, so "
                     "either may be the one that drifts)")
    client = [f"run {i + 1}" for i, t in enumerate(timelines) if t.client_clock_evidence]
    if client:
        parts.append("this client's wall clock stepped (" + ", ".join(client) + "; every client phase is timed on "
                     "its monotonic clock, so none moved with it)")
    return "; ".join(parts)


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
