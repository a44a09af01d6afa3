"""End-to-end streaming benchmark through a running worker (`breeze-client bench`).

Labels: `short` / `medium` / `long` (13 / 53 / 115 words, the qwen3-tts-rs e2e_bench sizes) and the
user's three chunks, whose audio lasted 13.76 s, 7.36 s and 4.80 s. Texts for the chunks are sized at
SPEECH_RATE words per second (150 words a minute, ordinary read English): 34, 18 and 12 words.

Every request carries an explicit frame limit, so runs are comparable even when the end of speech is
random (the tiny default's random weights): a word-sized label gets FRAMES_PER_WORD frames per word (the
same speaking rate at 12.5 frames per second), a chunk its own duration. A request may still end earlier
on end of speech; the frames and end reasons are reported.

Each round sends one request from each of `concurrency` clients (one channel each) at once. Per label:
client wall time (request sent -> final message) mean / stddev / min / max, audio seconds, RTF
(wall / audio), frames per second, time to first audio (client and worker), inter-chunk latency
p50 / p90 / p99 (gaps between consecutive chunks' arrival, pooled over requests), the worker's stage split,
and each round's aggregate throughput (audio seconds / round wall time).

A request that fails (a `BreezeClientError`: the worker's queue is full, a deadline, ...) does not stop the
benchmark: it is counted under its status code per label (`errors`, `failures`) and left out of every
statistic, which are computed over the requests that completed (`requests`).
"""

from __future__ import annotations

import datetime
import statistics
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from breeze_client import phases
from breeze_client.errors import BreezeClientError
from breeze_client.sdk import BreezeClient
from breeze_client.types import SynthesisRequest

SCHEMA = "breeze-client-bench/1"
FRAME_RATE_HZ = 12.5
SPEECH_RATE = 2.5  # words per second
FRAMES_PER_WORD = FRAME_RATE_HZ / SPEECH_RATE  # 5


@dataclass(frozen=True)
class BenchLabel:
    name: str
    text: str
    frame_limit: int
    sized_by: str  # how the text and the frame limit were chosen

    @property
    def words(self) -> int:
        return len(self.text.split())


_SHORT = "The library opens at nine tomorrow morning, so please bring your own card."
_MEDIUM = ("Our team spent the afternoon testing the speech system on the laptop in the corner office. "
           "It read the weather report, a recipe for lentil soup, and two pages from a travel guide "
           "about the northern coast. Everyone agreed that the voice sounded calm, the pauses felt natural, "
           "and nobody noticed the delay.")
_LONG = ("When the ferry finally left the harbour, the passengers crowded along the railings to watch the town "
         "grow small behind them. A child pointed at the lighthouse and asked how its lamp could be seen so "
         "far out at sea. Her grandfather explained that the glass around the flame bent the light into a "
         "narrow beam, and that sailors once counted its flashes to know which coast they were passing. "
         "Later the wind picked up, the sky turned a pale shade of grey, and most people went inside to drink "
         "tea and play cards. By evening the islands appeared on the horizon, dark and quiet, with a few "
         "windows already glowing warmly in the dusk.")
_CHUNK_1 = ("Thank you for calling the service desk. Your request has been received and a technician will "
            "contact you within two full working days. Please keep your reference number ready when they call you "
            "back.")
_CHUNK_2 = ("Turn left at the next junction, then continue straight ahead for about three hundred metres until "
            "the bridge.")
_CHUNK_3 = "Your package was delivered this afternoon and left at the front door."


def _by_words(name: str, text: str) -> BenchLabel:
    words = len(text.split())
    return BenchLabel(name, text, round(words * FRAMES_PER_WORD),
                      f"{words} words at {SPEECH_RATE:g} words/s -> {words * FRAMES_PER_WORD:g} frames")


def _by_seconds(name: str, text: str, seconds: float) -> BenchLabel:
    return BenchLabel(name, text, round(seconds * FRAME_RATE_HZ),
                      f"user chunk of {seconds:.2f} s: {len(text.split())} words ({seconds:.2f} s x "
                      f"{SPEECH_RATE:g} words/s), {seconds:.2f} s x {FRAME_RATE_HZ:g} frames/s")


LABELS: dict[str, BenchLabel] = {label.name: label for label in (
    _by_words("short", _SHORT), _by_words("medium", _MEDIUM), _by_words("long", _LONG),
    _by_seconds("chunk-13.76s", _CHUNK_1, 13.76), _by_seconds("chunk-7.36s", _CHUNK_2, 7.36),
    _by_seconds("chunk-4.80s", _CHUNK_3, 4.80),
)}
FRAME_LIMIT_NOTE = ("every request carries an explicit frame limit (max_frames) so runs are comparable: with the "
                    "tiny default's random weights the end of speech is random; a request may still end earlier "
                    "on end of speech (see frames and end_reasons)")


# ---- statistics ----
def percentile(values: list[float], q: float) -> float | None:
    """The phase model's percentile (linear interpolation, q in 0..100); None for no values."""
    return phases.percentile(values, q) if values else None


def spread(values: list[float]) -> dict:
    """mean / stddev (sample; 0 for one value) / min / max."""
    if not values:
        return {"mean": None, "stddev": None, "min": None, "max": None}
    return {"mean": statistics.fmean(values), "stddev": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def quantiles(values: list[float]) -> dict:
    return {"count": len(values), "mean": statistics.fmean(values) if values else None,
            "p50": percentile(values, 50), "p90": percentile(values, 90), "p99": percentile(values, 99),
            "max": max(values) if values else None}


# ---- one request ----
def _one(client: BreezeClient, request: SynthesisRequest, timeout_s: float | None) -> dict:
    stream = client.stream(request, collect_audio=False, timeout_s=timeout_s)
    arrivals = [chunk.received_ns for chunk in stream]
    result = stream.result
    timing, stats = result.timing, result.stats
    assert timing.final_received_ns is not None  # a stream has a result once its final message arrived
    wall_s = (timing.final_received_ns - timing.request_sent_ns) / 1e9
    return {
        "sent_ns": timing.request_sent_ns, "final_ns": timing.final_received_ns, "wall_s": wall_s,
        "audio_s": stats.audio_seconds, "frames": stats.frames, "end_reason": stats.end_reason,
        "ttfa_ms": timing.ttfa_ms, "worker_ttfa_ms": stats.ttfa_s * 1e3, "worker_rtf": stats.rtf,
        "gaps_ms": [(b - a) / 1e6 for a, b in zip(arrivals, arrivals[1:])],
        "stages_s": stats.stages.to_dict(), "queue_wait_s": result.job.queue_wait_s,
        "template": result.job.template,
        "ttfa_split_ms": ttfa_split(timing, result.job.queue_wait_s, result.job.server_received_ns),
        "end_split_ms": end_split(timing, result.artifact),
    }


TTFA_PARTS = ("to_queue", "queue", "worker", "transit")


def ttfa_split(timing, queue_wait_s: float, received_ns: int | None = None) -> dict | None:
    """Where one request's time to first audio went, in ms, from the worker's stamps mapped to this clock:
    `to_queue` request sent -> queued at the worker (this process's send, the network, the worker's receipt
    and checks), `queue` the wait for an engine slot, `worker` job start -> first chunk left the engine,
    `transit` -> first chunk received here (the event loop's send, the network, this process's receipt). The
    parts add up to the client's TTFA. With the worker's receipt stamp (`received_ns`, mapped) `to_worker`
    says how much of `to_queue` passed before the worker's handler had the request (the rest is the
    worker's admission). Each carries the clock mapping's uncertainty (zero on one host). None without audio."""
    started, first = timing.server_started_ns, timing.server_first_chunk_ns
    if started is None or first is None or timing.first_chunk_received_ns is None:
        return None
    queued = started - round(queue_wait_s * 1e9)
    out = {"to_queue": (queued - timing.request_sent_ns) / 1e6, "queue": queue_wait_s * 1e3,
           "worker": (first - started) / 1e6, "transit": (timing.first_chunk_received_ns - first) / 1e6}
    if received_ns is not None:
        out["to_worker"] = (received_ns - timing.request_sent_ns) / 1e6
    return out


END_PARTS = ("commit", "storage", "to_client")


def end_split(timing, artifact) -> dict | None:
    """Where one request's time after its last frame went, in ms, from the worker's stamps mapped to this
    clock: `commit` generation done -> artifact committed (the wait for an artifact-I/O thread and the
    commit itself), of which `storage` is inside the commit's storage calls (fsyncs, hash, renames), and
    `to_client` committed -> the final message received here. None when the worker did not report them."""
    done, committed = timing.server_done_ns, timing.server_committed_ns
    if done is None or committed is None or timing.final_received_ns is None:
        return None
    commit = None if artifact is None else artifact.commit
    return {"commit": (committed - done) / 1e6,
            "storage": None if commit is None else commit.storage_ns / 1e6,
            "to_client": (timing.final_received_ns - committed) / 1e6}


@dataclass(frozen=True)
class RequestMix:
    """Which clients send which kind of request: client i sends an instruction with CFG when
    i % cfg_every == cfg_every - 1 and clones the reference when i % clone_every == clone_every - 1 (0: never).
    The default (no reference) sends every client the run's own options."""

    cfg_every: int = 0
    clone_every: int = 0
    instruction: str = "Speak clearly and naturally."
    cfg_scale: float = 2.0
    reference_audio: bytes | None = None
    reference_text: str | None = None

    def kind(self, i: int) -> str:
        cfg = bool(self.cfg_every) and i % self.cfg_every == self.cfg_every - 1
        clone = bool(self.clone_every) and i % self.clone_every == self.clone_every - 1
        return {(False, False): "plain", (True, False): "cfg", (False, True): "clone",
                (True, True): "clone+cfg"}[(cfg, clone)]

    def options(self, i: int) -> dict:
        kind = self.kind(i)
        out: dict = {}
        if "cfg" in kind:
            out.update(instruction=self.instruction, cfg_scale=self.cfg_scale)
        if "clone" in kind:
            if not self.reference_audio or not self.reference_text:
                raise ValueError("a mix that clones needs reference audio and its transcript")
            out.update(reference_audio=self.reference_audio, reference_text=self.reference_text)
        return out


def _round(clients: list[BreezeClient], pool: ThreadPoolExecutor, label: BenchLabel, frame_limit: int,
           seed: int, options: dict, timeout_s: float | None, mix: RequestMix | None = None) -> list[dict]:
    """One request per client, all released together; a failed request gives {"client", "code", "message"}."""
    gate = threading.Barrier(len(clients))

    def go(i: int) -> dict:
        extra = {**options, **(mix.options(i) if mix else {})}
        request = SynthesisRequest(text=label.text, seed=seed + i, max_frames=frame_limit, **extra)
        gate.wait()
        try:
            return {"client": i, "kind": mix.kind(i) if mix else "plain", **_one(clients[i], request, timeout_s)}
        except BreezeClientError as exc:  # one failed request is a result, not the end of the benchmark
            return {"client": i, "code": exc.code, "message": exc.message}

    return list(pool.map(go, range(len(clients))))


def _failed(result: dict) -> bool:
    return "code" in result


def _split_summary(requests: list[dict]) -> dict:
    """p50 / p95 of each TTFA part (`ttfa_split`) over the requests that have one."""
    splits = [r["ttfa_split_ms"] for r in requests if r.get("ttfa_split_ms")]
    parts = TTFA_PARTS + (("to_worker",) if any("to_worker" in s for s in splits) else ())
    return {part: {"p50": percentile([s[part] for s in splits if part in s], 50),
                   "p95": percentile([s[part] for s in splits if part in s], 95)} for part in parts}


def _end_summary(requests: list[dict]) -> dict:
    """p50 / p95 / max of each part of the time after the last frame (`end_split`)."""
    splits = [r["end_split_ms"] for r in requests if r.get("end_split_ms")]
    out = {}
    for part in END_PARTS:
        values = [s[part] for s in splits if s.get(part) is not None]
        out[part] = {"p50": percentile(values, 50), "p95": percentile(values, 95),
                     "max": max(values) if values else None}
    return out


def summarize(label: BenchLabel, frame_limit: int, requests: list[dict], rounds: list[list[dict]]) -> dict:
    """Statistics over the requests that completed; failed ones (in `requests` and `rounds` too) are counted
    by status code in `errors` and listed in `failures`."""
    failures = [{"round": i, **r} for i, batch in enumerate(rounds) for r in batch if _failed(r)]
    requests = [r for r in requests if not _failed(r)]
    rounds = [[r for r in batch if not _failed(r)] for batch in rounds]
    valid = [r for r in requests if r["audio_s"] > 0]
    stages = {k: statistics.fmean(r["stages_s"][k] for r in requests) for k in requests[0]["stages_s"]} \
        if requests else {}
    throughput = []
    for batch in rounds:
        if not batch:  # every request of the round failed
            throughput.append({"elapsed_s": None, "audio_s": 0.0, "x_realtime": None, "rtf": None})
            continue
        elapsed = (max(r["final_ns"] for r in batch) - min(r["sent_ns"] for r in batch)) / 1e9
        audio = sum(r["audio_s"] for r in batch)
        throughput.append({"elapsed_s": elapsed, "audio_s": audio,
                           "x_realtime": audio / elapsed if elapsed > 0 else None,
                           "rtf": elapsed / audio if audio > 0 else None})
    ttfa = [r["ttfa_ms"] for r in requests if r["ttfa_ms"] is not None]
    return {
        "label": label.name, "words": label.words, "text": label.text, "frame_limit": frame_limit,
        "sized_by": label.sized_by, "requests": len(requests), "attempted": len(requests) + len(failures),
        "errors": dict(Counter(f["code"] for f in failures)),
        "failures": [{k: f.get(k) for k in ("round", "client", "code", "message")} for f in failures],
        "frames": spread([float(r["frames"]) for r in requests]),
        "end_reasons": dict(Counter(r["end_reason"] for r in requests)),
        "wall_s": spread([r["wall_s"] for r in requests]),
        "audio_s": spread([r["audio_s"] for r in requests]),
        "rtf": spread([r["wall_s"] / r["audio_s"] for r in valid]),
        "frames_per_s": spread([r["frames"] / r["wall_s"] for r in requests if r["wall_s"] > 0]),
        "ttfa_ms": {**spread(ttfa), "p50": percentile(ttfa, 50), "p90": percentile(ttfa, 90),
                    "p99": percentile(ttfa, 99)},
        "worker_ttfa_ms": spread([r["worker_ttfa_ms"] for r in requests]),
        "inter_chunk_ms": quantiles([g for r in requests for g in r["gaps_ms"]]),
        "queue_wait_s": spread([r["queue_wait_s"] for r in requests]),
        "ttfa_split_ms": _split_summary(requests),
        "end_split_ms": _end_summary(requests),
        "worker_stages_s": stages,
        "rounds": throughput,
        "aggregate_x_realtime": spread([t["x_realtime"] for t in throughput if t["x_realtime"] is not None]),
        "per_request": [{k: v for k, v in r.items() if k != "gaps_ms"} | {"round": i}
                        for i, batch in enumerate(rounds) for r in batch],
    }


def run_bench(make_client: Callable[[], BreezeClient], labels: list[str], *, warmup: int = 1,
              iterations: int = 3, concurrency: int = 1, seed: int = 1, frames: int | None = None,
              options: dict | None = None, timeout_s: float | None = None,
              progress: Callable[[str], None] | None = None, mix: RequestMix | None = None) -> dict:
    """Run the benchmark; the JSON-able document (schema `breeze-client-bench/1`).

    `frames` replaces every label's frame limit (quick runs); `options` are extra SynthesisRequest fields
    (instruction, cfg_scale, temperature, ...); `mix` gives some clients CFG or a reference to clone."""
    unknown = [name for name in labels if name not in LABELS]
    if unknown:
        raise ValueError(f"unknown label(s) {', '.join(unknown)}; known: {', '.join(LABELS)}")
    if concurrency < 1 or iterations < 1 or warmup < 0:
        raise ValueError("--concurrency and --iterations must be >= 1, --warmup >= 0")
    options = dict(options or {})
    clients = [make_client() for _ in range(concurrency)]
    try:
        info = clients[0].worker_info()
        for c in clients:
            c.clock()  # the clock exchange happens before any timed call
        label_docs: list[dict] = []
        doc = {"schema": SCHEMA, "meta": {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "target": clients[0].options.target, "worker_model": info.model_description,
            "worker_is_tiny_default": info.is_tiny_default, "worker_version": info.version,
            "concurrency": concurrency, "warmup": warmup, "iterations": iterations, "seed": seed,
            "frames_override": frames, "request_options": options, "frame_limit_note": FRAME_LIMIT_NOTE,
            "speech_rate_words_per_s": SPEECH_RATE, "streaming": True, "frames_per_chunk": 1,
            "request_kinds": dict(Counter(mix.kind(i) if mix else "plain" for i in range(concurrency)))},
            "labels": label_docs}
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="bench-client") as pool:
            for name in labels:
                label = LABELS[name]
                limit = frames or label.frame_limit
                for i in range(warmup):
                    if progress:
                        progress(f"{name}: warm-up {i + 1}/{warmup}")
                    _round(clients, pool, label, limit, seed, options, timeout_s, mix)
                rounds = []
                for i in range(iterations):
                    if progress:
                        progress(f"{name}: iteration {i + 1}/{iterations} x {concurrency} clients")
                    rounds.append(_round(clients, pool, label, limit, seed + 1000 * i, options, timeout_s, mix))
                requests = [r for batch in rounds for r in batch]
                label_docs.append(summarize(label, limit, requests, rounds))
        return doc
    finally:
        for c in clients:
            c.close()

