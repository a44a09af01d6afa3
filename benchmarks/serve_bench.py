#!/usr/bin/env python
"""Serve benchmark: the real worker serving a checkpoint through gRPC, measured as a user sees it.

One run, on one GPU host (one device call):
  1. start-up, cold: `breeze-worker serve --model DIR` with empty compile caches (Inductor, Triton), timed from
     process start to the ready line (health SERVING) and to full capacity (the start-up's background build
     done; every later phase runs at full capacity), with the worker's own split (load, codec graphs, warm-up);
  2. the first request after SERVING (time to first audio) against the steady TTFA of the next few requests;
  3. `breeze-client bench` at each --concurrency (a request mix: every 2nd client an instruction with CFG, every
     4th a clone of --reference, else of speech made here with espeak-ng; without either, no clones, and the
     JSON's meta says so): client-side aggregate x real time, TTFA p50/p95, per-stream RTF, inter-chunk gap
     p99 (in frames too), the worker's CPU seconds per audio second during the run, and where the TTFA went
     (the client bench's `ttfa_split_ms`: to the worker's queue, the queue, the worker, the way back);
     --profile-levels samples the worker's threads with py-spy during those levels' loads (when installed);
  4. start-up again with the caches warm (--skip-warm-start: not); --profile-startup samples every start-up
     with py-spy and splits its time by what ran: Dynamo, AOT autograd, Inductor, Triton, CUDA graph capture,
     weights, imports, else our innermost function (the load thread's waits included);
  5. (--engine-bench) `breeze-worker bench --concurrency ...` on the same device, on the same prompts (the
     label's text, half with CFG, a quarter cloning the same reference): the engine's aggregate at the same
     concurrency without gRPC, and the ratio gRPC / engine;
  6. (--t4-projection) the projected T4 figures from the batch-1 run: the per-frame byte floor at a T4's
     320 GB/s plus the overhead this run measured above this device's floor.

    python benchmarks/serve_bench.py --make-checkpoint full --device cuda --concurrency 1,8,32,64 \\
        --engine-bench --out serve.json
    python benchmarks/serve_bench.py --model /models/ckpt --device cpu --concurrency 1,2 --frames 4   # smoke

Writes one JSON document (--out) with the GPU, versions, commit and date, rewritten after each phase.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_env import pythonpath_for, use_source_tree

READY = re.compile(r"breeze-worker ready: synthesis=(\S+) artifacts=(\S+)")
# the progressive start's end (engine/startup.py); a worker without it is complete at its ready line
FULL = re.compile(r"full capacity: (\d+) of (\d+) streams ready")
STREAMS_READY = re.compile(r"; streams (\d+)/(\d+) ready")
METRICS_AT = re.compile(r"metrics on (http://\S+/metrics)")
SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) ([-+\d.eE]+|NaN|\+Inf)$")
SPLIT = {  # worker log line -> start-up phase
    "load_s": re.compile(r"model loaded in ([\d.]+) s"),
    "codec_graphs_s": re.compile(r"codec graphs for up to \d+ streams ready in ([\d.]+) s"),
    "warmup_s": re.compile(r"warm-up done in ([\d.]+) s"),
    "engine_ready_s": re.compile(r"engine ready in ([\d.]+) s"),
    # the batched fast path's own parts (CUDA): compiling its step, capturing its graphs, the text encoder's
    "batched_step_compile_s": re.compile(r"compiled the batched step for \d+ batch shapes in ([\d.]+) s"),
    "batched_step_capture_s": re.compile(r"captured \d+ CUDA graphs for \d+ batch shapes in ([\d.]+) s"),
    "text_encoder_capture_s": re.compile(r"captured the text encoder for \d+ batch shapes .* in ([\d.]+) s"),
}
# A start-up profile's sample belongs to the category of its innermost frame that names one (a Triton call
# inside Inductor's compile is Triton's); a sample with none is "other" with its innermost frame of ours.
STARTUP_CATEGORIES = (
    ("CUDA graph capture", ("torch/cuda/graphs.py",)),
    ("Triton (kernel compile and load)", ("triton/",)),
    ("Inductor (lowering, code generation, its caches)", ("torch/_inductor/",)),
    ("AOT autograd", ("torch/_functorch/",)),
    ("Dynamo (tracing, guards)", ("torch/_dynamo/",)),
    ("weights (read, convert)", ("safetensors", "breeze_worker/model/loader.py")),
    ("imports", ("<frozen importlib._bootstrap",)),
)
FRAME_S = 0.08
T4_BANDWIDTH = 320e9  # bytes/s, the T4's memory bandwidth (datasheet)
REFERENCE_TEXT = "Please call Stella. Ask her to bring these things with her from the store."


def _cache_env(cache: Path) -> dict[str, str]:
    """The compile caches (Inductor, Triton) of one run, as the worker's and the engine bench's environment."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Worker:
    """`breeze-worker serve` as a subprocess; its log goes to a file, the ready line is waited for."""

    def __init__(self, args: argparse.Namespace, cache: Path, log_path: Path, artifacts: Path,
                 extra: list[str] | None = None, tree: Path | None = None, cpus: str | None = None):
        """`extra`: more `serve` arguments (a variant's settings); `tree`: run the worker from another source
        tree (its worker/, client/ and protos/ first on PYTHONPATH), e.g. an earlier commit as the baseline;
        `cpus`: run it under `taskset -c CPUS` (its compile workers inherit the set)."""
        self.env = {**os.environ, **_cache_env(cache), "PYTHONUNBUFFERED": "1"}
        if args.torch_logs:  # e.g. Dynamo recompiles after SERVING land in the kept log
            self.env["TORCH_LOGS"] = args.torch_logs
        if tree is not None:
            self.env["PYTHONPATH"] = pythonpath_for(tree, self.env.get("PYTHONPATH"))
        self.cmd = [sys.executable, "-m", "breeze_worker.cli", "serve", "--device", args.device, "--port", "0",
                    "--artifact-port", "0", "--artifact-dir", str(artifacts),
                    "--max-active-streams", str(max(args.concurrency)), "--max-queue", str(max(args.concurrency)),
                    "--metrics-port", "0",
                    *(["--model", str(args.model)] if args.model else []), *args.worker_arg, *(extra or [])]
        if cpus:
            self.cmd = ["taskset", "-c", cpus, *self.cmd]
        self.log_path = log_path
        self.started = 0.0  # time.perf_counter() at launch
        self.ready_s: float | None = None
        self.streams_ready: tuple[int, int] | None = None  # (ready, configured) from the ready line
        self.full_s: float | None = None  # launch -> every stream ready (`wait_full`)
        self._watcher: threading.Thread | None = None
        self.proc: subprocess.Popen | None = None
        self.target = ""
        self.metrics_url = ""

    def start(self, timeout_s: float, profile: Path | None = None) -> dict:
        """Start and wait for the ready line; the start-up's time and the worker's own split. `profile`: sample
        the start-up with py-spy into that file (folded stacks) and summarize it (`startup_profile`)."""
        t0 = self.started = time.perf_counter()
        self.launched_wall = time.time()
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=self.env)
        profiler = _profile_startup(self.proc.pid, profile) if profile is not None else None
        assert self.proc.stdout is not None
        try:
            while True:
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"the worker exited before it was ready; log: {self.log_path}")
                match = READY.search(line)
                if match:
                    self.target = match.group(1)
                    ready = STREAMS_READY.search(line)
                    self.streams_ready = (int(ready.group(1)), int(ready.group(2))) if ready else None
                    break
                if time.perf_counter() - t0 > timeout_s:
                    raise RuntimeError(f"the worker was not ready in {timeout_s:.0f} s")
        finally:
            _stop_profile(profiler)
        ready_s = self.ready_s = time.perf_counter() - t0
        self.log.flush()
        if self.streams_ready is not None:
            self._watcher = threading.Thread(target=self._watch_full, daemon=True)
            self._watcher.start()
        text = self.log_path.read_text()
        found = METRICS_AT.search(text)
        self.metrics_url = found.group(1) if found else ""
        split = {k: float(m.group(1)) for k, pattern in SPLIT.items() if (m := pattern.search(text))}
        result = {"process_start_to_serving_s": ready_s, **split}
        if profiler is not None and profile is not None and profile.exists():
            result["profile"] = {"file": profile.name, **startup_profile(profile.read_text(), PROFILE_RATE_HZ)}
        return result

    def _watch_full(self, poll_s: float = 0.05) -> None:
        """From the ready line on, poll the log for the line saying all streams are ready (engine/startup.py) and
        note when it came (`full_s`, seconds from launch)."""
        while self.proc is not None and self.proc.poll() is None:
            if FULL.search(self.log_path.read_text()):
                self.full_s = time.perf_counter() - self.started
                return
            time.sleep(poll_s)

    def logged_at(self, pattern: re.Pattern) -> float | None:
        """Seconds from launch to the first log line matching `pattern`, by the line's own time stamp (text log
        format, local time, milliseconds); None when no line matches."""
        self.log.flush()
        for line in self.log_path.read_text().splitlines():
            if pattern.search(line):
                try:
                    stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                except ValueError:
                    return None
                return stamp - self.launched_wall
        return None

    def wait_full(self, timeout_s: float) -> float | None:
        """Seconds from launch to full capacity: every configured stream admitted and the start-up's background
        build done (the log line engine/startup.py writes at its end); an earlier tree, whose ready line says
        nothing of streams, is complete at its ready line. None: not within `timeout_s` from now."""
        if self.streams_ready is None:
            return self.ready_s
        if self._watcher is not None:
            self._watcher.join(timeout_s)
        return self.full_s

    def metrics(self) -> dict[str, float]:
        """The worker's /metrics samples by name (with labels), {} when it has no metrics port."""
        if not self.metrics_url:
            return {}
        import urllib.request

        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            lines = response.read().decode().splitlines()
        return {m.group(1): float(m.group(2)) for line in lines if (m := SAMPLE.match(line))}

    def cpu_s(self) -> float:
        assert self.proc is not None
        return _cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _single_requests(target: str, count: int, frames: int) -> list[tuple[float, float, dict]]:
    """(client TTFA, worker TTFA in ms, the worker's stage times) of `count` single plain requests one after
    the other, on one channel: the first includes the channel's connection set-up, which the worker's own
    figure does not."""
    from breeze_client.sdk import BreezeClient
    from breeze_client.types import SynthesisRequest

    out = []
    with BreezeClient(target) as client:
        for i in range(count):
            result = client.synthesize(SynthesisRequest(text="Hello from the serve benchmark.", seed=100 + i,
                                                        max_frames=frames))
            out.append((result.timing.ttfa_ms, result.stats.ttfa_s * 1e3, result.stats.stages.to_dict()))
    return out


def _client_bench(target: str, concurrency: int, args: argparse.Namespace, reference: dict | None) -> dict:
    cmd = [sys.executable, "-m", "breeze_client.cli", "bench", "--target", target, "--labels", args.label,
           "--warmup", "1", "--iterations", str(args.iterations), "--concurrency", str(concurrency),
           "--timeout", "600", "--json", "-", "--cfg-every", "2"]
    if args.frames:
        cmd += ["--frames", str(args.frames)]
    if reference is not None:
        cmd += ["--clone-every", "4", "--reference", reference["path"], "--reference-text", reference["text"]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"breeze-client bench failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def _summary(doc: dict, cpu_s: float) -> dict:
    """The client's figures of one `breeze-client bench` run, and the worker's own for the same requests
    (its TTFA and RTF count from the job's start in the engine: the difference to the client's is the
    transport, the queue and the client process)."""
    label = doc["labels"][0]
    requests = label["per_request"]
    rtfs = [r["wall_s"] / r["audio_s"] for r in requests if r["audio_s"] > 0]
    worker_rtfs = [r["worker_rtf"] for r in requests if r.get("worker_rtf")]
    audio = sum(r["audio_s"] for r in requests)
    gap_p99 = label["inter_chunk_ms"]["p99"]
    return {
        "worker_ttfa_ms_p50": _pct([r.get("worker_ttfa_ms") for r in requests], 50),
        "worker_ttfa_ms_p95": _pct([r.get("worker_ttfa_ms") for r in requests], 95),
        "worker_rtf_mean": statistics.fmean(worker_rtfs) if worker_rtfs else None,
        "worker_rtf_max": max(worker_rtfs) if worker_rtfs else None,
        "queue_wait_ms_max": max((1e3 * r.get("queue_wait_s", 0.0) for r in requests), default=None),
        "requests": label["requests"], "failed": label["attempted"] - label["requests"], "errors": label["errors"],
        "aggregate_x_realtime": label["aggregate_x_realtime"]["mean"],
        "ttfa_ms_p50": label["ttfa_ms"]["p50"], "ttfa_ms_p95": _pct([r["ttfa_ms"] for r in requests], 95),
        "rtf_per_stream_max": max(rtfs) if rtfs else None,
        "rtf_per_stream_mean": statistics.fmean(rtfs) if rtfs else None,
        "inter_chunk_gap_ms_p99": gap_p99,
        "inter_chunk_gap_frames_p99": gap_p99 / (FRAME_S * 1e3) if gap_p99 else None,
        "worker_cpu_s": cpu_s, "worker_cpu_s_per_audio_s": cpu_s / audio if audio else None,
        "kinds": doc["meta"].get("request_kinds"),
        "ttfa_split_ms": label.get("ttfa_split_ms"),
        "end_split_ms": label.get("end_split_ms"),
    }


def _process_cost(before: dict[str, float], after: dict[str, float]) -> dict:
    """What the worker process itself cost during a phase, from its own metrics: the event loop's timer lag
    (p99 from the histogram's buckets), the engine thread's idle share, CPU seconds per message written."""
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    if not after:
        return {}
    buckets = sorted((float(k.split('le="')[1].rstrip('"}')), delta(k)) for k in after
                     if k.startswith("breeze_event_loop_lag_seconds_bucket") and "+Inf" not in k)
    count = delta("breeze_event_loop_lag_seconds_count")
    lag_p99 = next((bound for bound, n in buckets if count and n >= 0.99 * count), None)
    busy, idle = delta("breeze_engine_busy_seconds_total"), delta("breeze_engine_idle_seconds_total")
    messages = delta("breeze_stream_messages_total")
    steps = delta("breeze_step_seconds_count")
    return {"step_ms_mean": 1e3 * delta("breeze_step_seconds_sum") / steps if steps else None,
            "event_loop_lag_s_p99_at_most": lag_p99,
            "event_loop_lag_s_mean": delta("breeze_event_loop_lag_seconds_sum") / count if count else None,
            "engine_idle_fraction": idle / (busy + idle) if busy + idle > 0 else None,
            "gc_pauses_gen2": delta('breeze_gc_pause_seconds_count{generation="2"}'),
            "gc_pause_s_gen2": delta('breeze_gc_pause_seconds_sum{generation="2"}'),
            "messages": messages, "cpu_s_per_message": delta("process_cpu_seconds_total") / messages
            if messages else None}


def _pct(values: list[float], q: float) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    k = (len(values) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def _engine_bench(args: argparse.Namespace, out_dir: Path, cache: Path, reference: dict | None) -> dict:
    """The engine sweep at the run's concurrency and frames, with the worker's compile caches (warm by now), on
    the client mix's prompts: the label's text for every stream, half with an instruction and CFG, every 4th
    cloning the same reference (the streams differ from the client's only in which ones)."""
    from breeze_client.bench import LABELS

    path = out_dir / "engine_sweep.json"
    cmd = [sys.executable, "-m", "breeze_worker.cli", "bench", "--device", args.device,
           "--concurrency", ",".join(map(str, args.concurrency)), "--json", str(path),
           "--frames", str(_frames(args)), "--text", LABELS[args.label].text,
           *(["--clone-every", "4", "--reference", reference["path"], "--reference-text", reference["text"]]
             if reference is not None else []),
           *(["--model", str(args.model)] if args.model else ["--size", args.make_checkpoint or "full"])]
    subprocess.run(cmd, check=True, timeout=3600, stdout=subprocess.DEVNULL, env={**os.environ, **_cache_env(cache)})
    return json.loads(path.read_text())


def _synthetic_checkpoint(work: Path, size: str) -> tuple[Path, dict]:
    """The work directory's synthetic checkpoint of `size`: reused when an earlier run of this bench finished
    writing it (its notice, written last, names the size and seed 0), else written afresh (a partial one is
    removed first). Returns the directory and the run's `meta.checkpoint`."""
    from breeze_worker.model.synthetic import write_synthetic_checkpoint, written_whole

    out = work / f"checkpoint-{size}"
    meta = {"synthetic": size, "note": "random weights: the audio is not speech"}
    if written_whole(out, size):
        return out, {**meta, "reused": True}
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    write_synthetic_checkpoint(out, size)
    return out, {**meta, "write_s": time.perf_counter() - t0, "reused": False}


def _frames(args: argparse.Namespace) -> int:
    """Frames a request of the run asks for (the label's limit unless --frames overrides it)."""
    from breeze_client.bench import LABELS

    return args.frames or LABELS[args.label].frame_limit


def _variant(text: str) -> dict:
    """`name=NAME[,cache=warm|cold][,tree=DIR][,levels=1+8][,args=SERVE ARGS]` (args last: it may hold commas;
    levels: this variant's concurrency levels, else --variant-concurrency's)."""
    usage = f"--variant {text!r}: name=NAME[,cache=warm|cold][,tree=DIR][,levels=N+N][,args=...]"
    head, _, tail = text.partition(",args=")
    spec = dict(part.split("=", 1) for part in head.split(",") if part)
    if ("name" not in spec or spec.get("cache", "warm") not in ("warm", "cold")
            or set(spec) - {"name", "cache", "tree", "levels"}):
        raise argparse.ArgumentTypeError(usage)
    try:
        levels = [int(x) for x in spec["levels"].split("+")] if spec.get("levels") else None
    except ValueError:
        raise argparse.ArgumentTypeError(usage) from None
    return {"name": spec["name"], "cache": spec.get("cache", "warm"),
            "tree": Path(spec["tree"]) if spec.get("tree") else None, "levels": levels, "args": tail.split()}


def _load(worker: Worker, levels: list[int], args: argparse.Namespace, reference: dict | None, work: Path,
          tag: str, out: dict, save) -> None:
    """`breeze-client bench` at each concurrency against a running worker, with the worker's own cost, into
    `out` by level; `save()` after each level."""
    for c in levels:
        cpu0, m0 = worker.cpu_s(), worker.metrics()
        profiler = _profile(worker, work / f"pyspy_{tag}_c{c}") if c in args.profile_levels else None
        try:
            bench = _client_bench(worker.target, c, args, reference)
        finally:
            _stop_profile(profiler)
        out[str(c)] = _summary(bench, worker.cpu_s() - cpu0)
        out[str(c)]["worker_process"] = _process_cost(m0, worker.metrics())
        (work / f"client_bench_{tag}_c{c}.json").write_text(json.dumps(bench))
        save()
        print(f"{tag} c={c}: {json.dumps(out[str(c)])}", flush=True)


def _py_spy_record(pid: int, options: list[str], what: str) -> subprocess.Popen | None:
    """`py-spy record --pid PID --threads --idle --nonblocking OPTIONS` (idle threads too, so waits show; the
    worker is never paused to be sampled); None, with a note, when py-spy is not installed. py-spy is looked
    for beside this interpreter first (a virtual environment need not be on PATH)."""
    beside = Path(sys.executable).parent / "py-spy"
    exe = str(beside) if beside.exists() else shutil.which("py-spy")
    if exe is None:
        print(f"serve bench: py-spy is not installed: no {what}", file=sys.stderr)
        return None
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--threads", "--idle", "--nonblocking", *options],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _profile(worker: Worker, stem: Path) -> subprocess.Popen | None:
    """py-spy sampling every thread of the worker while a load runs, as a Chrome trace (the engine thread's
    timeline)."""
    assert worker.proc is not None
    return _py_spy_record(worker.proc.pid, ["--rate", "250", "--format", "chrometrace", "--output",
                                            f"{stem}.trace.json"], "profile")


PROFILE_RATE_HZ = 100


def _profile_startup(pid: int, path: Path) -> subprocess.Popen | None:
    """py-spy sampling the starting worker and its subprocesses (compile workers) as folded stacks."""
    return _py_spy_record(pid, ["--subprocesses", "--rate", str(PROFILE_RATE_HZ), "--format", "raw", "--output",
                                str(path)], "start-up profile")


def _startup_file(args: argparse.Namespace, work: Path, name: str) -> Path | None:
    return work / f"pyspy_startup_{name}.folded" if args.profile_startup else None


PROFILE_OTHERS = 12  # "other" functions of ours named one by one; the rest are summed


def _category(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, marks in STARTUP_CATEGORIES:
            if any(mark in frame for mark in marks):
                return name
    ours = next((f for f in reversed(frames) if "breeze_worker/" in f), None)
    return "other: " + re.sub(r":\d+\)$", ")", ours) if ours else "other"  # by function, not by line


def startup_profile(folded: str, rate_hz: float) -> dict:
    """Seconds of a start-up by category (STARTUP_CATEGORIES), for the thread that loads the model (the one
    whose stacks hold `Engine._load`: its waits count, they are the start-up's), for the main thread, and the
    subprocesses' samples in all. `folded`: py-spy's raw output with --subprocesses --threads, one line a stack
    (`process PID:"cmd";[process CHILD:"cmd";]thread (TID)[: name];frame;... count`)."""
    threads: dict[str, list[tuple[list[str], int]]] = {}
    root, sub_samples = None, 0
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        parts = stack.split(";")
        if not count.isdigit() or not parts[0].startswith("process "):
            continue  # a piece of a subprocess's command line that held a line break
        root = root or re.match(r"process (\d+)", parts[0])
        if len(parts) > 1 and parts[1].startswith("process "):
            sub_samples += int(count)
            continue
        thread = re.match(r"thread \((\d+)\)", parts[1]) if len(parts) > 1 else None
        if thread is not None:
            threads.setdefault(thread.group(1), []).append((parts[2:], int(count)))

    def by_category(samples: list[tuple[list[str], int]]) -> dict[str, float]:
        totals: dict[str, float] = {}
        for frames, n in samples:
            name = _category(frames)
            totals[name] = totals.get(name, 0.0) + n / rate_hz
        ranked = sorted(totals.items(), key=lambda item: -item[1])
        lumped = set([name for name, _ in ranked if name.startswith("other: ")][PROFILE_OTHERS:])
        kept: dict[str, float] = {}
        for name, seconds in ranked:
            key = "other: the rest of ours" if name in lumped else name
            kept[key] = kept.get(key, 0.0) + seconds
        return {name: round(seconds, 3) for name, seconds in sorted(kept.items(), key=lambda item: -item[1])}

    loading = next((t for t, samples in threads.items()
                    if any("Engine._load" in frame for frames, _ in samples for frame in frames)), None)
    main = root.group(1) if root is not None else None
    return {"rate_hz": rate_hz,
            "load_thread_s": by_category(threads[loading]) if loading else {},
            "main_thread_s": by_category(threads[main]) if main in threads else {},
            "subprocesses_samples_s": sub_samples / rate_hz}


def _stop_profile(profiler: subprocess.Popen | None) -> None:
    if profiler is not None:  # py-spy writes its file on SIGINT
        profiler.send_signal(signal.SIGINT)
        try:
            profiler.wait(60)
        except subprocess.TimeoutExpired:
            profiler.kill()


def _meta(args: argparse.Namespace) -> dict:
    meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(), "host": platform.node(), "argv": sys.argv[1:],
            "commit": args.commit or os.environ.get("BREEZE_COMMIT")}
    if not meta["commit"]:
        try:
            meta["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                            text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            meta["commit"] = "unknown"
    try:
        import torch

        meta["torch"] = torch.__version__
        if torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name(0)
            meta["cuda"] = torch.version.cuda
        import triton  # noqa: F401

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    return meta


def _reference(folder: Path, given: Path | None = None, text: str | None = None) -> dict | None:
    """The clone requests' reference: `given` (its exact transcript `text`), else real speech made here with
    espeak-ng, else None (no clone requests: a GPU host's image may lack espeak-ng; make the file where it is
    and pass --reference). Returns {"path", "text", "source"}."""
    if given is not None:
        if not text:
            raise SystemExit("--reference needs --reference-text, the recording's exact transcript")
        return {"path": str(given), "text": text, "source": "--reference"}
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        return None
    path = folder / "reference.wav"
    subprocess.run([espeak, "-w", str(path), REFERENCE_TEXT], check=True, timeout=60)
    return {"path": str(path), "text": REFERENCE_TEXT, "source": "espeak-ng"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="checkpoint directory")
    p.add_argument("--make-checkpoint", choices=("full", "mid", "tiny"), default=None,
                   help="write a synthetic checkpoint of this size first (breeze-worker make-checkpoint; one "
                        "a run already wrote whole into --work-dir is reused)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--reference", type=Path, default=None,
                   help="reference speech for the clone requests (every 4th client; default: made with espeak-ng)")
    p.add_argument("--reference-text", default=None, help="the --reference recording's exact transcript")
    p.add_argument("--concurrency", default="1,8,32,64", type=lambda s: [int(x) for x in s.split(",") if x])
    p.add_argument("--label", default="chunk-7.36s", help="breeze-client bench label (text and frame limit)")
    p.add_argument("--frames", type=int, default=None, help="frame limit override (quick runs)")
    p.add_argument("--iterations", type=int, default=2, help="timed rounds per concurrency")
    p.add_argument("--single-requests", type=int, default=6, help="first + steady single requests after SERVING")
    p.add_argument("--engine-bench", action="store_true", help="also run the engine sweep (no gRPC)")
    p.add_argument("--skip-warm-start", action="store_true",
                   help="no second start on the warm caches (a call short of time that measured it before)")
    p.add_argument("--t4-projection", action="store_true", help="print the projected T4 figures")
    p.add_argument("--bytes-per-frame", type=float, default=12.96e9,
                   help="weight bytes read per frame at batch 1 (12.96e9: the full model in half precision)")
    p.add_argument("--bandwidth", type=float, default=None,
                   help="this device's measured copy bandwidth in bytes/s (default: measured here on CUDA)")
    p.add_argument("--worker-arg", action="append", default=[], help="extra `breeze-worker serve` argument")
    p.add_argument("--variant", action="append", default=[], type=_variant,
                   help="after the main run, start the worker again with other settings or code and load it at "
                        "--variant-concurrency: name=NAME[,cache=warm|cold][,tree=DIR][,args=SERVE ARGS] "
                        "(cache=cold: empty compile caches of its own; tree: another source tree, a baseline)")
    p.add_argument("--variant-concurrency", default=None, type=lambda s: [int(x) for x in s.split(",") if x],
                   help="the variants' concurrency levels (default: --concurrency)")
    p.add_argument("--profile-levels", default=[], type=lambda s: [int(x) for x in s.split(",") if x],
                   help="concurrency levels of the main load to sample with py-spy (if installed)")
    p.add_argument("--profile-startup", action="store_true",
                   help="sample every start-up with py-spy (when installed): seconds by category in the JSON")
    p.add_argument("--keep", type=Path, default=None,
                   help="copy the worker logs and client JSON here (after every phase)")
    p.add_argument("--torch-logs", default="recompiles",
                   help="TORCH_LOGS for the worker (default: recompiles, so a compile after SERVING is logged)")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--work-dir", type=Path, default=None, help="caches, logs, checkpoint (default: a temp dir)")
    p.add_argument("--out", type=Path, default=Path("serve_bench.json"))
    p.add_argument("--commit", default=None, help="the commit to record (default: $BREEZE_COMMIT, else git HEAD; "
                   "a copied tree's git metadata may be stale: pass it)")
    args = p.parse_args(argv)
    use_source_tree()  # the checkout's packages, here and in the worker and client processes

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="serve-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    doc: dict = {"schema": "breeze-serve-bench/1", "meta": _meta(args), "startup": {}, "load": {}}

    def save() -> None:
        args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        if args.keep is not None:  # after every phase: a run cut short by its time limit keeps what it had
            args.keep.mkdir(parents=True, exist_ok=True)
            for path in (sorted(work.glob("worker-*.log")) + sorted(work.glob("client_bench_*.json"))
                         + sorted(work.glob("pyspy_*"))):
                shutil.copy(path, args.keep / path.name)

    if args.make_checkpoint:
        args.model, doc["meta"]["checkpoint"] = _synthetic_checkpoint(work, args.make_checkpoint)
    reference = _reference(work, args.reference, args.reference_text)
    doc["meta"]["reference"] = reference
    if reference is None:
        print("serve bench: no espeak-ng and no --reference: no clone requests in this run", file=sys.stderr)
    cache = work / "compile-cache"
    shutil.rmtree(cache, ignore_errors=True)
    worker = Worker(args, cache, work / "worker-cold.log", work / "artifacts")
    try:
        doc["startup"]["cold"] = worker.start(args.startup_timeout, _startup_file(args, work, "cold"))
        # the requests and loads below measure the worker at full capacity (its start-up's background build done;
        # benchmarks/startup_bench.py measures what is served before)
        doc["startup"]["cold"]["full_capacity_s"] = worker.wait_full(args.startup_timeout)
        save()
        pairs = _single_requests(worker.target, args.single_requests, frames=4)
        ttfa, worker_ttfa = [p[0] for p in pairs], [p[1] for p in pairs]
        steady = statistics.median(ttfa[1:]) if len(ttfa) > 1 else None
        worker_steady = statistics.median(worker_ttfa[1:]) if len(worker_ttfa) > 1 else None
        doc["first_request"] = {"first_ttfa_ms": ttfa[0], "steady_ttfa_ms_median": steady,
                                "ratio": ttfa[0] / steady if steady else None, "all_ttfa_ms": ttfa,
                                "worker_first_ttfa_ms": worker_ttfa[0], "worker_steady_ttfa_ms_median": worker_steady,
                                "worker_ratio": worker_ttfa[0] / worker_steady if worker_steady else None,
                                "worker_stages_s": [p[2] for p in pairs]}
        save()
        _load(worker, args.concurrency, args, reference, work, "main", doc["load"], save)
    finally:
        worker.stop()
    if not args.skip_warm_start:
        warm = Worker(args, cache, work / "worker-warm.log", work / "artifacts")
        try:
            doc["startup"]["warm_caches"] = warm.start(args.startup_timeout, _startup_file(args, work, "warm"))
            doc["startup"]["warm_caches"]["full_capacity_s"] = warm.wait_full(args.startup_timeout)
            save()
        finally:
            warm.stop()
    if args.engine_bench:  # before the variants: the main run's figures come first in a call's time
        engine = _engine_bench(args, work, cache, reference)
        doc["engine"] = engine
        ratios = {}
        for row in engine.get("rows", []):
            c = str(row.get("streams"))
            if c in doc["load"] and row.get("aggregate_x_realtime") and doc["load"][c]["aggregate_x_realtime"]:
                ratios[c] = doc["load"][c]["aggregate_x_realtime"] / row["aggregate_x_realtime"]
        doc["grpc_over_engine"] = ratios
        save()
    for v in args.variant:
        name = v["name"]
        v_cache = work / f"compile-cache-{name}" if v["cache"] == "cold" else cache
        if v["cache"] == "cold":
            shutil.rmtree(v_cache, ignore_errors=True)
        entry = doc.setdefault("variants", {})[name] = {"spec": {**v, "tree": str(v["tree"] or "")}}
        # a cold variant starts twice (empty caches, then its own caches warm) and is loaded on the second start
        starts = ["startup_cold", "startup_warm"] if v["cache"] == "cold" else ["startup_warm"]
        for key in starts:
            w = Worker(args, v_cache, work / f"worker-{name}-{key}.log", work / "artifacts", v["args"], v["tree"])
            try:
                entry[key] = w.start(args.startup_timeout, _startup_file(args, work, f"{name}-{key}"))
                entry[key]["full_capacity_s"] = w.wait_full(args.startup_timeout)
                if key == starts[-1]:
                    _load(w, v["levels"] or args.variant_concurrency or args.concurrency, args, reference, work,
                          name, entry.setdefault("load", {}), save)
                save()
            except Exception as exc:  # noqa: BLE001 - a failed variant is a result; the others still run
                entry["error"] = f"{type(exc).__name__}: {exc}"
                save()
                break
            finally:
                w.stop()
    save()
    if args.t4_projection:  # from every run with one client: the main one and each such variant
        if "1" in doc["load"]:
            doc["t4_projection"] = _t4(doc["load"]["1"], args)
        for entry in doc.get("variants", {}).values():
            if "1" in entry.get("load", {}):
                entry["t4_projection"] = _t4(entry["load"]["1"], args)
        save()
    print(json.dumps({k: doc[k] for k in ("startup", "first_request", "load", "variants", "grpc_over_engine")
                      if k in doc}, indent=1))
    if "t4_projection" in doc:
        print(json.dumps(doc["t4_projection"], indent=1))
    for name, entry in doc.get("variants", {}).items():
        if "t4_projection" in entry:
            print(name, json.dumps(entry["t4_projection"], indent=1))
    return 0


def _t4(one: dict, args: argparse.Namespace) -> dict:
    """Batch-1 ms per frame on this device (`one`: a load's one-client summary), its floor, the overhead above
    it, and a T4's floor + that overhead."""
    ms_per_frame = FRAME_S * 1e3 / one["aggregate_x_realtime"]
    bandwidth = args.bandwidth
    if bandwidth is None:
        import torch

        from breeze_worker.measure.instruments import copy_bandwidth

        bandwidth = copy_bandwidth(torch.device("cuda"))
    floor_ms = args.bytes_per_frame / bandwidth * 1e3
    overhead_ms = max(0.0, ms_per_frame - floor_ms)
    t4_ms = args.bytes_per_frame / T4_BANDWIDTH * 1e3 + overhead_ms
    return {"measured_ms_per_frame_batch1": ms_per_frame, "device_bandwidth_bytes_s": bandwidth,
            "device_floor_ms": floor_ms, "overhead_ms": overhead_ms, "t4_floor_ms": args.bytes_per_frame / T4_BANDWIDTH
            * 1e3, "t4_projected_ms_per_frame": t4_ms, "t4_projected_rtf": t4_ms / (FRAME_S * 1e3),
            "note": "projected, not measured: a T4's byte floor plus the overhead measured here (a lower bound)"}


if __name__ == "__main__":
    sys.exit(main())
