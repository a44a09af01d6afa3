"""Retrieval diagnostics on a live worker: run jobs (or take artifact ids), fetch, time, attribute.

    with BreezeClient(target) as client:
        run = run_diagnosis(client, DiagnoseSettings(jobs=3, configs=sweep_configs([65536, 0], ["none", "zstd"])))
        print(format_text(run))                  # per-phase p50/p95/max, the verdict, its evidence, the fix
        write_report("diag.html", run.diagnosis, run.timelines, sweep=run.sweep_rows())

Each job is fetched as soon as its final message arrives, with the first fetch configuration; this is
the run the verdict is about; with `parallel`, the jobs run at once and each is fetched as its own final
message arrives (existing artifacts are all fetched at once). Further configurations (chunk size x
compression) re-fetch the same artifacts and are compared on the fetch phases only. The SDK records the
write time inside the transfer, which is attributed to the client write phase (see phases.py); files go
through `TimedFile`, which keeps each write call's interval for callers that want them.

The clock mapping is checked on every run: a clock exchange on both channels before each job (or
before the Stat of an existing artifact) and after each fetch, `EXCHANGE_SAMPLES` round trips each,
outside the timed phases; `evidence.build_timeline` weighs them against the order of the run's events.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from breeze_client.clock import ClockMapping, now_ns
from breeze_client.clockcheck import Exchange
from breeze_client.evidence import build_timeline, exchange_from
from breeze_client.phases import (
    LAST_BYTE_RECEIVED,
    PHASES,
    REQUEST_SENT,
    Timeline,
    delivery_rate,
    fetch_ns,
    format_phase_value,
    format_seconds,
    phase_times,
    phases_dict,
    summarize,
    transfer_rate,
)
from breeze_client.types import ArtifactRef, FetchResult, SynthesisResult
from breeze_client.verdict import Diagnosis, Verdict, diagnose

log = logging.getLogger(__name__)

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog, then rests in the shade by the river."
EXCHANGE_SAMPLES = 3  # round trips per clock exchange around each run (the fastest is kept)


@dataclass(frozen=True)
class FetchConfig:
    chunk_size: int = 0  # 0 = the worker's default
    compression: str = "none"  # none | zstd

    @property
    def label(self) -> str:
        chunk = "default" if not self.chunk_size else f"{self.chunk_size // 1024} KiB"
        return f"chunk {chunk}, {self.compression}"


def sweep_configs(chunk_sizes: Sequence[int] = (0,),
                  compressions: Sequence[str] = ("none",)) -> tuple[FetchConfig, ...]:
    return tuple(FetchConfig(c, z) for z in compressions for c in chunk_sizes)


@dataclass(frozen=True)
class DiagnoseSettings:
    jobs: int = 3  # synthesis jobs to run (ignored when artifact_ids are given)
    text: str = DEFAULT_TEXT
    artifact_ids: tuple[str, ...] = ()  # diagnose existing artifacts instead of running jobs
    max_frames: int | None = None
    seed: int | None = 1
    configs: tuple[FetchConfig, ...] = (FetchConfig(),)  # the first one is the diagnosed run
    out_dir: Path | None = None  # where fetched files go (None: a temporary directory, removed after)
    parallel: bool = False  # run the jobs at once (or fetch the artifact ids all at once, per configuration)
    encoding: str = "s16le"  # the jobs' PCM encoding (f32le: twice the bytes per second of audio)


class TimedFile:
    """A binary file that records the interval of each write call (client clock, ns)."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner
        self.writes: list[tuple[int, int]] = []  # (start, end) of each write call
        self.first_write_bytes = 0

    def write(self, data) -> int:
        t0 = now_ns()
        n = self._inner.write(data)
        if not self.writes:
            self.first_write_bytes = len(data)
        self.writes.append((t0, now_ns()))
        return n

    def write_time_within(self, start: int | None, end: int | None) -> int:
        if start is None or end is None:
            return 0
        return sum(max(0, min(b, end) - max(a, start)) for a, b in self.writes)

    def __getattr__(self, name):  # flush, fileno, seek, truncate, close ... of the real file
        return getattr(self._inner, name)


@dataclass
class SweepResult:
    config: FetchConfig
    diagnosis: Diagnosis
    timelines: list[Timeline]

    def fetch_seconds(self) -> list[float]:
        return [(t.events["file_fsynced"] - t.events["request_sent"]) / 1e9 for t in self.timelines
                if "file_fsynced" in t.events and "request_sent" in t.events]

    def to_dict(self) -> dict:
        s = summarize("fetch", self.fetch_seconds())
        rates = [r for t in self.timelines if (r := transfer_rate(t))]
        rate_p50 = summarize("rate", rates).p50_s  # None: no run measured a transfer rate
        return {"config": {"chunk_size": self.config.chunk_size, "compression": self.config.compression},
                "label": self.config.label, "request_to_disk": s.to_dict(),
                "transfer": self.diagnosis.summaries["transfer"].to_dict(),
                "mb_per_s_p50": None if rate_p50 is None else rate_p50 / 1e6,
                "wire_bytes": sum(t.wire_bytes for t in self.timelines), "dominant": self.diagnosis.verdict.title}


@dataclass
class DiagnoseRun:
    diagnosis: Diagnosis
    timelines: list[Timeline]
    sweep: list[SweepResult] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def sweep_rows(self) -> list[dict]:
        return [s.to_dict() for s in self.sweep]

    def to_dict(self) -> dict:
        return {"meta": self.meta, "diagnosis": self.diagnosis.to_dict(),
                "runs": [{**t.to_dict(), "phases": phases_dict(t)} for t in self.timelines],
                "sweep": [s.to_dict() for s in self.sweep]}


def timeline_from_results(label: str, fetch: FetchResult, *, synthesis: SynthesisResult | None = None,
                          artifact: ArtifactRef | None = None, timed_file: TimedFile | None = None,
                          clock: ClockMapping | None = None, parallel: int = 1,
                          exchanges: Sequence[Exchange] = (), stat_received_ns: int | None = None,
                          **extra) -> Timeline:
    """One retrieval's Timeline from the SDK's records (`evidence.build_timeline`).

    `exchanges` are the clock exchanges made around the run; without them, the channels' own mappings
    (and `clock`, if given) stand in. The bytes, chunks and write time come from the fetch itself, so the
    rates here are the ones `FetchResult.mb_per_s` reports (`timed_file` is accepted and unused).
    """
    exchanges = list(exchanges)
    if not exchanges and clock is not None and clock.samples:
        ft = fetch.timing
        exchanges = [exchange_from(clock, "of the synthesis channel"),
                     Exchange(ft.request_sent_ns, ft.clock_offset_ns, ft.clock_uncertainty_ns,
                              "of the artifact channel")]
    return build_timeline(label, fetch, synthesis=synthesis, artifact=artifact, exchanges=exchanges,
                          stat_received_ns=stat_received_ns, parallel=parallel, **extra)


def with_concurrency(timelines: Sequence[Timeline]) -> list[Timeline]:
    """Set each timeline's `parallel` to the fetches whose request -> last byte overlapped its own (itself
    included): what really shared the artifact channel, whatever was meant to."""
    spans = [(t.event(REQUEST_SENT), t.event(LAST_BYTE_RECEIVED)) for t in timelines]
    out = []
    for t, (a, b) in zip(timelines, spans):
        if a is None or b is None:
            out.append(t)
            continue
        n = sum(1 for c, d in spans if c is not None and d is not None and c < b and a < d)
        out.append(dataclasses.replace(t, parallel=max(1, n)))
    return out


DestFactory = Callable[[str, Path], BinaryIO]


def _open_dest(path: Path) -> BinaryIO:
    return open(path, "wb")


def fetch_timed(client, artifact: ArtifactRef | str, path: Path, config: FetchConfig,
                dest_factory: DestFactory | None = None) -> tuple[FetchResult, TimedFile]:
    """Fetch one artifact into `path` through a TimedFile; the SDK fsyncs and verifies the SHA-256."""
    artifact_id = artifact if isinstance(artifact, str) else artifact.artifact_id
    raw = (dest_factory or (lambda _id, p: _open_dest(p)))(artifact_id, path)
    timed = TimedFile(raw)
    try:
        result = client.fetch(artifact, timed, chunk_size=config.chunk_size, compression=config.compression)
    finally:
        raw.close()
    return result, timed


def fetch_many(client, refs: Sequence[ArtifactRef | str], out_dir: Path, config: FetchConfig, *,
               parallel: bool = True, dest_factory: DestFactory | None = None) -> list[tuple[FetchResult, TimedFile]]:
    """Fetch several artifacts into out_dir (in parallel over the one artifact channel, or one by one)."""
    def one(ref):
        artifact_id = ref if isinstance(ref, str) else ref.artifact_id
        return fetch_timed(client, ref, out_dir / f"{artifact_id}.wav", config, dest_factory)

    if not parallel or len(refs) < 2:
        return [one(r) for r in refs]
    with ThreadPoolExecutor(max_workers=len(refs), thread_name_prefix="fetch") as pool:
        return list(pool.map(one, refs))


class _Exchanges:
    """Clock exchanges on both channels, as `clockcheck.Exchange` records."""

    def __init__(self, client, artifact_target: str) -> None:
        self.client, self.artifact_target = client, artifact_target

    def now(self, label: str) -> list[Exchange]:
        out = []
        for target, channel in ((None, "synthesis"), (self.artifact_target, "artifact")):
            mapping = self.client.sync_clock(target, samples=EXCHANGE_SAMPLES)
            out.append(exchange_from(mapping, f"{label} ({channel} channel)"))
        return out


def run_diagnosis(client, settings: DiagnoseSettings, *, dest_factory: DestFactory | None = None,
                  progress: Callable[[str], None] | None = None) -> DiagnoseRun:
    """Run the jobs (or take the artifacts), fetch them per configuration, and diagnose the first one;
    `progress` hears of each run and each sweep configuration as it ends."""
    say = progress or (lambda text: None)
    if not settings.configs:
        raise ValueError("at least one fetch configuration is needed")
    tmp = None
    out_dir = settings.out_dir
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="breeze-diagnose-")
        out_dir = Path(tmp.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        client.clock()  # warm both channels and their clock mappings before anything is timed
        artifact_target = client.artifact_target()
        client.clock(artifact_target)
        clocks = _Exchanges(client, artifact_target)
        primary, *others = settings.configs
        timelines: list[Timeline] = []
        refs: list[ArtifactRef | str] = []
        if settings.artifact_ids:
            before = clocks.now("before the Stat")
            stats = []
            for artifact_id in settings.artifact_ids:
                ref = client.stat(artifact_id)
                stats.append((ref, now_ns()))
            refs = [ref for ref, _ in stats]
            fetched = fetch_many(client, refs, out_dir, primary, parallel=settings.parallel, dest_factory=dest_factory)
            say(f"{len(refs)} artifact(s) fetched ({primary.label})")
            after = clocks.now("after the fetch")
            for (ref, stat_received), (result, timed) in zip(stats, fetched):
                timelines.append(timeline_from_results(ref.artifact_id, result, artifact=ref, timed_file=timed,
                                                       exchanges=before + after, stat_received_ns=stat_received,
                                                       config=primary.label))
        else:
            first_before = clocks.now("before job 1")

            def job_then_fetch(i: int, before: list[Exchange]):
                result = client.synthesize(settings.text, seed=None if settings.seed is None else settings.seed + i,
                                           max_frames=settings.max_frames, encoding=settings.encoding,
                                           collect_audio=False)
                if result.artifact is None:
                    raise RuntimeError(f"job {result.job.job_id} ended without an artifact ({result.stats.end_reason})")
                fetched, timed = fetch_timed(client, result.artifact, out_dir / f"{result.artifact.artifact_id}.wav",
                                             primary, dest_factory)
                say(f"run {i + 1} of {settings.jobs}: {result.job.job_id} done, {result.artifact.artifact_id} fetched")
                return result, fetched, timed, before + clocks.now(f"after fetch {i + 1}")

            if settings.parallel and settings.jobs > 1:
                with ThreadPoolExecutor(max_workers=settings.jobs, thread_name_prefix="job") as pool:
                    done = list(pool.map(lambda i: job_then_fetch(i, first_before if i == 0 else
                                                                  clocks.now(f"before job {i + 1}")),
                                         range(settings.jobs)))
            else:
                done, before = [], first_before
                for i in range(settings.jobs):
                    done.append(job_then_fetch(i, before))
                    before = done[-1][3][-2:]  # the exchanges after one fetch open the next run
            for result, fetched, timed, exchanges in done:
                refs.append(result.artifact)
                timelines.append(timeline_from_results(result.artifact.artifact_id, fetched, synthesis=result,
                                                       timed_file=timed, exchanges=exchanges, config=primary.label,
                                                       job=result.job.job_id,
                                                       audio_seconds=result.stats.audio_seconds,
                                                       job_wall_s=result.stats.wall_seconds))
        if settings.parallel:
            timelines = with_concurrency(timelines)
        run = DiagnoseRun(diagnose(timelines), timelines, meta={
            "target": client.options.target, "artifact_target": artifact_target, "runs": len(timelines),
            "primary_config": primary.label, "parallel": settings.parallel, "date_unix_s": int(time.time()),
        })
        for config in others:
            before = clocks.now("before the sweep fetch")
            fetched = fetch_many(client, refs, out_dir, config, parallel=settings.parallel, dest_factory=dest_factory)
            exchanges = before + clocks.now("after the sweep fetch")
            sweep_timelines = [timeline_from_results(f"{fr.artifact_id} ({config.label})", fr, timed_file=tf,
                                                     exchanges=exchanges, config=config.label)
                               for fr, tf in fetched]
            if settings.parallel:
                sweep_timelines = with_concurrency(sweep_timelines)
            run.sweep.append(SweepResult(config, diagnose(sweep_timelines), sweep_timelines))
            say(f"sweep: {len(refs)} artifact(s) fetched again ({config.label})")
        if run.sweep:  # the primary configuration, on the same footing (fetch phases only)
            first = SweepResult(primary, run.diagnosis, timelines)
            run.sweep.insert(0, first)
        return run
    finally:
        if tmp is not None:
            tmp.cleanup()


def _clock_line(run: DiagnoseRun) -> str:
    statuses = [t.clock_status for t in run.timelines]
    unc = max((t.clock_uncertainty_ns for t in run.timelines), default=0) / 1e9
    client = [f"run {i + 1}" for i, t in enumerate(run.timelines) if t.client_clock_evidence]
    moved = f"; this client's wall clock stepped in {', '.join(client)} (no phase moved with it)" if client else ""
    if all(st == "ok" for st in statuses):
        return f"clock mapping ±{format_seconds(unc)}, checked on every run{moved}"
    return f"clock mapping ±{format_seconds(unc)}, checked on every run: the worker's clock: " + ", ".join(
        f"run {i + 1} {st}" + (" (re-mapped)" if st in ("stepped", "drift") else "")
        for i, st in enumerate(statuses) if st != "ok") + moved


def verdict_heading(v: Verdict) -> str:
    """The verdict's first line: healthy, the clock, or the cause and the phase it holds."""
    if v.severity == "ok":
        return f"healthy: {v.explanation}"
    if v.severity == "unknown":
        return f"clock mapping broken ({v.cause}): {v.explanation}"
    return f"{v.cause} in the {v.title} ({v.share:.0%} of the total): {v.explanation}"


def verdict_lines(v: Verdict) -> list[str]:
    """The verdict as text: its heading, the headline evidence, the fix, then the rest of the evidence."""
    lines = [f"verdict: {verdict_heading(v)}"] + [f"  - {e}" for e in v.evidence]
    if v.needs_runs:
        lines.append(f"  - to tell apart: {v.needs_runs}")
    lines.append(f"fix: {v.fix}")
    if v.details:
        lines += ["more evidence:"] + [f"  - {e}" for e in v.details]
    return lines


def format_text(run: DiagnoseRun) -> str:
    """The human summary: phase table, the verdict with evidence and fix, the sweep."""
    d = run.diagnosis
    lines = [f"retrieval diagnosis: {d.runs} run(s), {run.meta.get('primary_config', '')}, {_clock_line(run)}",
             f"{'phase':<22}{'where':<9}{'p50':>13}{'p95':>13}{'max':>13}"]
    unmeasured = {pt.phase.name for tl in run.timelines for pt in phase_times(tl) if pt.why}
    for phase in PHASES:
        s = d.summaries[phase.name]
        u = s.uncertainty_s
        row = [format_phase_value(v, u) for v in (s.p50_s, s.p95_s, s.max_s)]
        if phase.name in unmeasured:  # never printed as a measurement: the clock check could not map it
            row = [r if s.count else "clock?" for r in row]
        note = f"  ({len(run.timelines) - s.count} run(s) not measured: clock)" if phase.name in unmeasured else ""
        lines.append(f"{phase.title:<22}{phase.where:<9}{row[0]:>13}{row[1]:>13}{row[2]:>13}{note}")
    t = d.summaries["total"]
    if t.count:
        pm = f"  ±{format_seconds(t.uncertainty_s)}" if t.uncertainty_s else ""
        lines.append(f"{'generation done -> disk':<31}{format_seconds(t.p50_s):>13}{format_seconds(t.p95_s):>13}"
                     f"{format_seconds(t.max_s):>13}{pm}")
    else:
        broken = any("generation_done" in tl.events for tl in run.timelines)
        if broken:
            lines.append(f"{'generation done -> disk':<31}{'clock?':>13}{'clock?':>13}{'clock?':>13}  (it crosses "
                         "the broken clock mapping)")
        f = summarize("fetch", [None if (ns := fetch_ns(tl)) is None else ns / 1e9 for tl in run.timelines])
        lines.append(f"{'request -> disk':<31}{format_seconds(f.p50_s):>13}{format_seconds(f.p95_s):>13}"
                     f"{format_seconds(f.max_s):>13}"
                     + ("" if broken else "  (generation done is unknown for existing artifacts)"))
    w = d.summaries["waited"]
    meaning = "  (how long the file sat committed before it was asked for)"
    if w.count:
        pm = f"  ±{format_seconds(w.uncertainty_s)}" if w.uncertainty_s else ""
        lines.append(f"{'committed -> requested':<31}{format_seconds(w.p50_s):>13}{format_seconds(w.p95_s):>13}"
                     f"{format_seconds(w.max_s):>13}{pm}{meaning}")
    elif any("artifact_committed" in tl.events for tl in run.timelines):
        lines.append(f"{'committed -> requested':<31}{'clock?':>13}{'clock?':>13}{'clock?':>13}{meaning}")
    rates = [r for tl in run.timelines if (r := transfer_rate(tl))]
    rate = summarize("rate", rates).p50_s  # None: no run measured a transfer rate
    if rate is not None:
        delivered = [r for tl in run.timelines if (r := delivery_rate(tl))]
        through = summarize("rate", delivered).p50_s  # None: no delivery rate either
        burst = through is not None and through < rate / 3  # the bytes came in a burst after being held
        lines.append(f"transfer rate p50: {rate / 1e6:.2f} MB/s"
                     + ("" if through is None else
                        f" ({'a burst: ' if burst else ''}the path delivered {through / 1e6:.2f} MB/s from first "
                        "byte sent to last byte received)"))
    lines += [""] + verdict_lines(d.verdict)
    if run.sweep:
        lines += ["", f"{'sweep':<26}{'request->disk p50':>18}{'transfer p50':>14}{'MB/s':>8}{'wire MB':>9}"]
        for sweep in run.sweep:
            sweep_row = sweep.to_dict()
            mb_s = sweep_row["mb_per_s_p50"]
            lines.append(f"{sweep.config.label:<26}{format_seconds(sweep_row['request_to_disk']['p50_s']):>18}"
                         f"{format_seconds(sweep_row['transfer']['p50_s']):>14}"
                         f"{'-' if mb_s is None else f'{mb_s:.1f}':>8}{sweep_row['wire_bytes'] / 1e6:>9.2f}")
    return "\n".join(lines)

