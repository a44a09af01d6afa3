#!/usr/bin/env python
"""Start-up benchmark: the real worker (`breeze-worker serve`) started the ways a user's hosts start it, timed
from process start to SERVING (its ready line), to every configured stream admitted ("all in": the start-up's
log line for the piece that admitted the last ones) and to full capacity (everything built as configured: the
log line engine/startup.py writes at its end; a worker from an earlier tree is complete at its ready line), in
one run:

  new-cold         empty compile caches, no bundle, all CPUs; at SERVING the first request alone, then a burst
                   of --burst requests while the rest builds (their TTFA and RTF, and the worker's step time
                   meanwhile), then, at full capacity, steady single requests (the first request's ratio)
  new-warm         the same caches, warm; the frame-time loads (--load-levels, `breeze-client bench`) after
  new-warm-cpus    warm, under `taskset -c --cpus`
  compile          `breeze-worker compile` with the same settings (warm caches): the bundle
  new-bundle       empty caches with the bundle (`serve --compile-bundle`), all CPUs
  new-bundle-cpus  the same under taskset
  new-cold-cpus    empty caches, no bundle, under taskset (--cold-cpus)
  base-cold        --baseline-tree's worker on empty caches (--skip-baseline-cold: not)
  base-warm        the baseline on warm caches (its own, or new-cold's when its cold start was skipped: the
                   compiled graphs are the same where the code is), and the same loads

Cases run in that order (or --cases's); one that would not finish before --deadline-s (its estimate: the
longest case of its kind so far, else a default) is skipped and the JSON says so. Writes one JSON document
(--out, rewritten after each case) and prints a table last.

    python benchmarks/startup_bench.py --make-checkpoint full --device cuda --streams 8 --burst 8 \\
        --cpus 0-3 --baseline-tree .baseline --load-levels 1 --out startup-8.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import serve_bench as sb
from bench_env import use_source_tree

ALL_ADMITTED = re.compile(r"\((\d+) of \1 streams admitted now\)")  # engine/startup.py, each piece's line
DEFAULT_ESTIMATE_S = {"cold": 240.0, "warm": 90.0, "bundle": 90.0, "compile": 150.0}


def _worker_args(args: argparse.Namespace) -> argparse.Namespace:
    """What serve_bench's Worker and client bench read from their arguments."""
    return argparse.Namespace(
        device=args.device, model=args.model, concurrency=[args.streams], torch_logs=args.torch_logs,
        worker_arg=["--max-queue", str(max(args.streams, args.burst, 8)), *args.engine_arg, *args.worker_arg],
        label=args.label, frames=args.frames, iterations=args.iterations)


async def _burst(target: str, count: int, frames: int) -> list[dict]:
    """`count` requests at once on one channel (every other with an instruction and CFG): each one's client TTFA,
    the worker's TTFA and RTF (from its job start), its queue wait and the client's RTF (sent -> last message)."""
    from breeze_client.aio import AsyncBreezeClient
    from breeze_client.types import SynthesisRequest

    async with AsyncBreezeClient(target, timeout_s=600) as client:
        requests = [SynthesisRequest(text="A burst of requests while the worker is still warming up.",
                                     instruction="Speak calmly." if i % 2 == 0 else None,
                                     cfg_scale=1.5 if i % 2 == 0 else None, seed=200 + i, max_frames=frames)
                    for i in range(count)]
        results = await asyncio.gather(*(client.synthesize(r) for r in requests), return_exceptions=True)
    out = []
    for r in results:
        if isinstance(r, BaseException):
            out.append({"error": f"{type(r).__name__}: {r}"})
            continue
        t = r.timing
        wall = (t.final_received_ns - t.request_sent_ns) / 1e9 if t.final_received_ns else None
        queued = ((t.server_started_ns - t.request_sent_ns) / 1e9 if t.server_started_ns is not None else None)
        out.append({"ttfa_ms": t.ttfa_ms, "worker_ttfa_ms": 1e3 * r.stats.ttfa_s, "worker_rtf": r.stats.rtf,
                    "client_rtf": wall / r.stats.audio_seconds if wall and r.stats.audio_seconds else None,
                    "queue_s": queued, "audio_s": r.stats.audio_seconds})
    return out


def _burst_summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if "error" not in r]

    def stat(key: str) -> dict:
        values = sorted(r[key] for r in ok if r.get(key) is not None)
        return {"p50": sb._pct(values, 50), "max": values[-1] if values else None}

    return {"requests": len(rows), "errors": [r["error"] for r in rows if "error" in r], "ttfa_ms": stat("ttfa_ms"),
            "worker_ttfa_ms": stat("worker_ttfa_ms"), "worker_rtf": stat("worker_rtf"),
            "client_rtf": stat("client_rtf"), "queue_s": stat("queue_s")}


class Run:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work = args, work
        self.wargs = _worker_args(args)
        self.t0 = time.perf_counter()
        self.doc: dict = {"schema": "breeze-startup-bench/1", "meta": sb._meta(args), "streams": args.streams,
                          "cases": {}, "skipped": {}}
        self.spent: dict[str, float] = {}  # kind -> longest case of that kind so far
        self.bundle: Path | None = None
        self.logs: set[Path] = set()

    def save(self) -> None:
        self.args.out.write_text(json.dumps(self.doc, indent=1, default=str) + "\n")
        if self.args.keep is not None:  # this run's logs (a --work-dir shared with an earlier run holds others)
            self.args.keep.mkdir(parents=True, exist_ok=True)
            for path in sorted(self.logs):
                if path.exists():
                    shutil.copy(path, self.args.keep / path.name)

    def remaining(self) -> float:
        """Seconds left before --deadline-s (at least 1): what a wait may take."""
        return max(1.0, self.args.deadline_s - (time.perf_counter() - self.t0))

    def fits(self, name: str, kind: str) -> bool:
        if self.args.cases and name not in self.args.cases:
            self.doc["skipped"][name] = "not in --cases"
            self.save()
            return False
        estimate = self.spent.get(kind, self.args.estimate.get(kind, DEFAULT_ESTIMATE_S[kind]))
        elapsed = time.perf_counter() - self.t0
        if elapsed + estimate > self.args.deadline_s:
            self.doc["skipped"][name] = (f"deadline: {elapsed:.0f} s spent, ~{estimate:.0f} s more expected, "
                                         f"--deadline-s {self.args.deadline_s:.0f}")
            self.save()
            return False
        return True

    def cache(self, name: str, fresh: bool) -> Path:
        path = self.work / f"cache-{name}"
        if fresh:
            shutil.rmtree(path, ignore_errors=True)
        return path

    def start(self, name: str, kind: str, cache: Path, *, tree: Path | None = None, cpus: str | None = None,
              extra: list[str] | None = None, then=None) -> dict | None:
        """Start a worker, time SERVING and full capacity, run `then(worker, entry)`, stop it; the case's entry."""
        if not self.fits(name, kind):
            return None
        began = time.perf_counter()
        entry: dict = {"kind": kind, "cpus": cpus or "all", "tree": str(tree or "this")}
        self.doc["cases"][name] = entry
        worker = sb.Worker(self.wargs, cache, self.work / f"worker-{name}.log", self.work / "artifacts", extra, tree,
                           cpus=cpus)
        self.logs.add(worker.log_path)
        try:
            entry.update(worker.start(min(self.args.startup_timeout, self.remaining())))
            entry["streams_ready_at_serving"] = list(worker.streams_ready) if worker.streams_ready else None
            if then is not None:
                then(worker, entry)
            entry["full_capacity_s"] = worker.wait_full(min(self.args.startup_timeout, self.remaining()))
            entry["all_streams_admitted_s"] = (entry["process_start_to_serving_s"] if worker.streams_ready is None
                                               or worker.streams_ready[0] >= worker.streams_ready[1]
                                               else worker.logged_at(ALL_ADMITTED))
        except Exception as exc:  # noqa: BLE001 - a failed case is a result; the others still run
            entry["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            worker.stop()
            self.spent[kind] = max(self.spent.get(kind, 0.0), time.perf_counter() - began)
            entry["case_s"] = time.perf_counter() - began
            self.save()
        print(f"{name}: {json.dumps({k: v for k, v in entry.items() if k != 'profile'}, default=str)[:600]}",
              flush=True)
        return entry

    # ---- what runs on a started worker ----
    def during_build(self, worker: sb.Worker, entry: dict) -> None:
        """At SERVING: the first request alone, then a burst while the rest builds; at full capacity, steady
        single requests."""
        first = sb._single_requests(worker.target, 1, frames=4)
        entry["first_request"] = {"ttfa_ms": first[0][0], "worker_ttfa_ms": first[0][1],
                                  "at_s": time.perf_counter() - worker.started}
        if self.args.burst:
            m0 = worker.metrics()
            building = (worker.streams_ready is not None and worker.streams_ready[0] < worker.streams_ready[1]
                        and worker.full_s is None)
            rows = asyncio.run(_burst(worker.target, self.args.burst, self.args.burst_frames))
            entry["burst"] = {"during_build": building, "ended_during_build": worker.full_s is None,
                              **_burst_summary(rows),
                              "worker_process": sb._process_cost(m0, worker.metrics()), "rows": rows}
        entry["full_capacity_s"] = worker.wait_full(min(self.args.startup_timeout, self.remaining()))
        if entry["full_capacity_s"] is None:
            return  # out of time: no steady requests to compare with
        steady = sb._single_requests(worker.target, self.args.single_requests, frames=4)
        median = statistics.median(p[0] for p in steady)
        worker_median = statistics.median(p[1] for p in steady)
        entry["first_request"].update({"steady_ttfa_ms_median": median, "ratio": first[0][0] / median,
                                       "worker_steady_ttfa_ms_median": worker_median,
                                       "worker_ratio": first[0][1] / worker_median})
        metrics = worker.metrics()
        entry["slower_form_steps"] = {k.split('"')[1]: v for k, v in metrics.items()
                                      if k.startswith("breeze_slower_form_steps_total{")}

    def loads(self, worker: sb.Worker, entry: dict) -> None:
        """The frame-time loads at full capacity (client bench at each --load-levels level)."""
        if worker.wait_full(min(self.args.startup_timeout, self.remaining())) is None:
            entry["load_skipped"] = "not at full capacity before the deadline"
            return
        out = entry.setdefault("load", {})
        for level in self.args.load_levels:
            cpu0, m0 = worker.cpu_s(), worker.metrics()
            bench = sb._client_bench(worker.target, level, self.wargs, None)
            out[str(level)] = sb._summary(bench, worker.cpu_s() - cpu0)
            out[str(level)]["worker_process"] = sb._process_cost(m0, worker.metrics())
            out[str(level)]["ms_per_frame"] = (1e3 * sb.FRAME_S / out[str(level)]["aggregate_x_realtime"]
                                               if out[str(level)]["aggregate_x_realtime"] else None)
            self.save()

    def compile_bundle(self, cache: Path) -> None:
        if not self.fits("compile", "compile"):
            return
        began = time.perf_counter()
        path = self.work / f"bundle-{self.args.streams}.bin"
        cmd = [sys.executable, "-m", "breeze_worker.cli", "compile", "--device", self.args.device,
               "--max-active-streams", str(self.args.streams), "--out", str(path),
               *(["--model", str(self.args.model)] if self.args.model else []), *self.args.engine_arg]
        env = {**os.environ, **sb._cache_env(cache)}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.remaining(), env=env)
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
            proc = subprocess.CompletedProcess(cmd, -9, "", f"timed out at the deadline\n{stderr}")
        log = self.work / f"compile-{self.args.streams}.log"
        log.write_text(proc.stderr)
        self.logs.add(log)
        entry = {"kind": "compile", "seconds": time.perf_counter() - began, "returncode": proc.returncode,
                 "stdout": proc.stdout.strip()[-500:]}
        if proc.returncode == 0 and path.exists():
            self.bundle = path
            entry["bundle_mb"] = path.stat().st_size / 1e6
        self.spent["compile"] = entry["seconds"]
        self.doc["cases"]["compile"] = entry
        self.save()
        print(f"compile: {json.dumps(entry)[:400]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="checkpoint directory")
    p.add_argument("--make-checkpoint", choices=("full", "mid", "tiny"), default=None,
                   help="write (or reuse, from --work-dir) a synthetic checkpoint of this size first")
    p.add_argument("--device", default="cuda")
    p.add_argument("--streams", type=int, default=8, help="--max-active-streams of every worker started")
    p.add_argument("--burst", type=int, default=8, help="requests at once right after the cold start's SERVING")
    p.add_argument("--burst-frames", type=int, default=48, help="frame limit of the burst's requests")
    p.add_argument("--single-requests", type=int, default=5, help="steady single requests at full capacity")
    p.add_argument("--cpus", default="0-3", help="the taskset cases' CPU list ('' : no taskset cases)")
    p.add_argument("--cold-cpus", action="store_true", help="also a cold start under taskset")
    p.add_argument("--baseline-tree", type=Path, default=None, help="an earlier source tree (worker/ client/ protos/)")
    p.add_argument("--skip-baseline-cold", action="store_true",
                   help="no cold start of the baseline (its warm start uses this tree's warm caches)")
    p.add_argument("--load-levels", default=[1], type=lambda s: [int(x) for x in s.split(",") if x],
                   help="client bench concurrency levels on the warm new and baseline workers (frame time)")
    p.add_argument("--label", default="chunk-7.36s", help="breeze-client bench label")
    p.add_argument("--frames", type=int, default=None, help="the loads' frame limit override")
    p.add_argument("--iterations", type=int, default=1, help="timed rounds per load level")
    p.add_argument("--engine-arg", action="append", default=[],
                   help="an engine setting for every worker and for `compile` (it shapes what is compiled)")
    p.add_argument("--worker-arg", action="append", default=[], help="a `serve`-only argument for every worker")
    p.add_argument("--torch-logs", default="recompiles")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--deadline-s", type=float, default=520.0, help="skip the cases that would end after this")
    p.add_argument("--estimate", action="append", default=[], metavar="KIND=SECONDS",
                   help="a kind's expected duration before one has run (kinds: cold, warm, bundle, compile; "
                        f"defaults {DEFAULT_ESTIMATE_S})")
    p.add_argument("--cases", default="", type=lambda s: [c for c in s.split(",") if c],
                   help="run only these cases (comma-separated names; default: all)")
    p.add_argument("--work-dir", type=Path, default=None)
    p.add_argument("--keep", type=Path, default=None, help="copy the worker logs here after each case")
    p.add_argument("--out", type=Path, default=Path("startup_bench.json"))
    p.add_argument("--commit", default=None)
    args = p.parse_args(argv)
    try:
        args.estimate = {k: float(v) for k, v in (e.split("=", 1) for e in args.estimate)}
    except ValueError:
        p.error("--estimate takes KIND=SECONDS")
    use_source_tree()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="startup-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    run = Run(args, work)
    if args.make_checkpoint:
        args.model, run.doc["meta"]["checkpoint"] = sb._synthetic_checkpoint(work, args.make_checkpoint)
        run.wargs = _worker_args(args)
    cpus = args.cpus or None
    new_cache = run.cache("new", fresh=True)
    tree = args.baseline_tree.resolve() if args.baseline_tree is not None else None
    base_cache = {"path": new_cache}  # the baseline's own once its cold start ran, else this tree's warm caches

    def bundle_case(name: str, on: str | None):
        if run.bundle is None:
            run.doc["skipped"][name] = "no bundle (compile did not run or failed)"
            return
        run.start(name, "bundle", run.cache(name, fresh=True), extra=["--compile-bundle", str(run.bundle)], cpus=on)

    def base_cold():
        if args.skip_baseline_cold:
            run.doc["skipped"]["base-cold"] = "--skip-baseline-cold (base-warm uses this tree's warm caches)"
            return
        base_cache["path"] = run.cache("base", fresh=True)
        run.start("base-cold", "cold", base_cache["path"], tree=tree)

    cases = {
        "new-cold": lambda: run.start("new-cold", "cold", new_cache, then=run.during_build),
        "new-warm": lambda: run.start("new-warm", "warm", new_cache, then=run.loads),
        "new-warm-cpus": lambda: cpus and run.start("new-warm-cpus", "warm", new_cache, cpus=cpus),
        "compile": lambda: run.compile_bundle(new_cache),
        "new-bundle": lambda: bundle_case("new-bundle", None),
        "new-bundle-cpus": lambda: cpus and bundle_case("new-bundle-cpus", cpus),
        "new-cold-cpus": lambda: cpus and args.cold_cpus and run.start(
            "new-cold-cpus", "cold", run.cache("cold-cpus", fresh=True), cpus=cpus),
        "base-cold": lambda: tree is not None and base_cold(),
        "base-warm": lambda: tree is not None and run.start("base-warm", "warm", base_cache["path"], tree=tree,
                                                            then=run.loads),
    }
    unknown = [c for c in args.cases if c not in cases]
    if unknown:
        p.error(f"--cases: unknown {unknown}; the cases are {list(cases)}")
    for name in args.cases or list(cases):  # --cases: those, in that order
        cases[name]()
    run.doc["summary"] = summary(run.doc)
    run.save()
    print(table(run.doc))
    return 0


def summary(doc: dict) -> dict:
    """The figures the targets name, and the frame-time ratios new / baseline at each load level."""
    cases = doc["cases"]
    out: dict = {}
    for name, entry in cases.items():
        if "process_start_to_serving_s" in entry:
            out[name] = {"serving_s": entry["process_start_to_serving_s"],
                         "all_streams_admitted_s": entry.get("all_streams_admitted_s"),
                         "full_s": entry.get("full_capacity_s")}
    cold = cases.get("new-cold", {})
    if "first_request" in cold and "ratio" in cold["first_request"]:
        out["first_request_ratio"] = cold["first_request"]["ratio"]
    if "burst" in cold:
        out["burst_worker_rtf_max"] = cold["burst"]["worker_rtf"]["max"]
        out["burst_ttfa_ms_max"] = cold["burst"]["ttfa_ms"]["max"]
    new, base = cases.get("new-warm", {}).get("load", {}), cases.get("base-warm", {}).get("load", {})
    out["frame_time_new_over_base"] = {
        level: new[level]["ms_per_frame"] / base[level]["ms_per_frame"]
        for level in new if level in base and new[level].get("ms_per_frame") and base[level].get("ms_per_frame")}
    return out


def table(doc: dict) -> str:
    def f(value, fmt="{:.1f}") -> str:
        return "-" if value is None else fmt.format(value)

    lines = [f"start-up, {doc['streams']} streams ({doc['meta'].get('gpu', 'no GPU')}, commit "
             f"{doc['meta'].get('commit')})",
             f"{'case':<16} {'cpus':<5} {'SERVING s':>9} {'all in s':>8} {'full s':>8} {'case s':>7}"]
    for name, entry in doc["cases"].items():
        if name == "compile":
            lines.append(f"{'compile':<16} {'all':<5} {'':>9} {'':>8} {'':>8} {f(entry.get('seconds')):>7}  "
                         f"bundle {f(entry.get('bundle_mb'))} MB, rc {entry.get('returncode')}")
            continue
        lines.append(f"{name:<16} {entry.get('cpus', ''):<5} {f(entry.get('process_start_to_serving_s')):>9} "
                     f"{f(entry.get('all_streams_admitted_s')):>8} {f(entry.get('full_capacity_s')):>8} "
                     f"{f(entry.get('case_s')):>7}"
                     + (f"  ERROR {entry['error'][:60]}" if "error" in entry else ""))
    for name, why in doc.get("skipped", {}).items():
        lines.append(f"{name:<16} skipped: {why}")
    s = doc.get("summary", {})
    cold = doc["cases"].get("new-cold", {})
    if "first_request" in cold:
        fr = cold["first_request"]
        lines.append(f"first request at SERVING: {f(fr.get('ttfa_ms'))} ms; steady {f(fr.get('steady_ttfa_ms_median'))}"
                     f" ms; ratio {f(fr.get('ratio'), '{:.2f}')} (worker {f(fr.get('worker_ratio'), '{:.2f}')})")
    if "burst" in cold:
        b = cold["burst"]
        during = "yes" if b["during_build"] else "NO"
        lines.append(f"burst of {b['requests']} during the build ({during}): TTFA p50/max "
                     f"{f(b['ttfa_ms']['p50'], '{:.0f}')}/{f(b['ttfa_ms']['max'], '{:.0f}')} ms, worker RTF p50/max "
                     f"{f(b['worker_rtf']['p50'], '{:.3f}')}/{f(b['worker_rtf']['max'], '{:.3f}')}, client RTF max "
                     f"{f(b['client_rtf']['max'], '{:.3f}')}, errors {len(b['errors'])}")
    for level, ratio in s.get("frame_time_new_over_base", {}).items():
        new = doc["cases"]["new-warm"]["load"][level]["ms_per_frame"]
        base = doc["cases"]["base-warm"]["load"][level]["ms_per_frame"]
        lines.append(f"frame time at {level} stream(s): new {new:.2f} ms, baseline {base:.2f} ms, ratio {ratio:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
