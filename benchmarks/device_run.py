#!/usr/bin/env python3
"""The device runner: the GPU suite and the benchmarks in one call on a GPU host, one JSON per step.

    python benchmarks/device_run.py --steps gpu-tests,engine-bench,sweep --out DIR [--commit SHA]

Each step runs in a process of its own under its own time limit (`--limit STEP=SECONDS`); a step that fails
or runs out of time is recorded and the next one runs. Each step's file is written as soon as the step ends,
so a call cut short by its host keeps the steps it finished. DIR receives `<step>.json` for each step (the command,
exit status, seconds, whether it timed out, the tool's own JSON under "result", and the end of its output) and
`summary.json` (the GPU, driver, torch and Triton versions, Python, date and commit, each step's outcome); each
step's file also carries them under "meta".
Exits 1 if any step failed.

Steps (what each measures is in its tool's docstring):
  gpu-tests          `pytest -m gpu tests/gpu`: the correctness suite; its "result" holds every test's outcome
                     and the figures the tests wrote (precision agreement, batched agreement, codec SNR)
  engine-bench       benchmarks/engine_bench.py: batch 1, bf16 (`--precision`), eager and fast, CFG off and on
  engine-bench-fp16  the same under fp16-mixed (the T4 policy), forced, CFG on
  sweep              benchmarks/concurrency_sweep.py at `--levels` (half the streams with CFG), with the batch-1
                     comparison and the batched-vs-alone agreement at 8 streams
  sweep-throughput   the sweep at 32 streams with the codec compiled for every slot bucket (the default: 16 and up)
  kernel-check       benchmarks/kernel_check.py: each served kernel against its byte floor
  serve-smoke        benchmarks/serve_smoke.py: the worker and the client end to end (needs grpcio, protobuf
                     and zstandard: carry them as wheels where the host lacks them)
  retrieval          benchmarks/retrieval_bench.py: generation done -> files on disk (CPU; the wan path needs root)

`--device cpu --size tiny --frames 3` runs the same steps on a CPU host (the GPU suite is then skipped with
its reason): a check of the runner itself. The commit is `--commit`, else $BREEZE_COMMIT, else this checkout's
git HEAD (a copied tree without .git records "unknown": pass the commit).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import bench_env

HERE = Path(__file__).resolve().parent
DEFAULT_STEPS = "gpu-tests,engine-bench,sweep"
OUTPUT_TAIL = 6000  # characters of a step's output kept in its JSON


@dataclass(frozen=True)
class Step:
    name: str
    limit_s: float  # the default time limit

    def command(self, args: argparse.Namespace, result: Path, work: Path) -> tuple[list[str], dict[str, str]]:
        """(argv, extra environment) of this step, writing its JSON to `result`."""
        py = sys.executable
        common = ["--commit", args.commit]
        bench = [py, str(HERE / "engine_bench.py"), "--device", args.device, "--size", args.size,
                 "--capacity", "256", "--frames", str(args.frames or 64), "--json", str(result), *common]
        sweep = [py, str(HERE / "concurrency_sweep.py"), "--device", args.device, "--size", args.size,
                 "--precision", args.precision, "--capacity", "256", "--frames", str(args.frames or 48),
                 "--batch-shapes", "sweep", "--json", str(result), *common]
        if self.name == "gpu-tests":
            argv = [py, "-m", "pytest", "-m", "gpu", str(bench_env.ROOT / "tests" / "gpu"), "-q", "-rfEs",
                    "-p", "no:cacheprovider", f"--junitxml={work / 'junit.xml'}", *args.pytest_arg]
            return argv, {"BREEZE_GPU_FIGURES": str(work / "figures")}
        if self.name == "engine-bench":
            return bench + ["--precision", args.precision, "--cfg", "off,on", "--paths", "eager,fast",
                            "--eager-frames", "8", "--repeats", "3"], {}
        if self.name == "engine-bench-fp16":
            return bench + ["--precision", "fp16-mixed", "--force-precision", "--cfg", "on", "--paths", "eager,fast",
                            "--eager-frames", "8", "--repeats", "3"], {}
        if self.name == "sweep":
            return sweep + ["--concurrency", args.levels, "--batch1", "--agreement-streams", "8",
                            "--agreement-prefill", "batched,per-stream"], {}
        if self.name == "sweep-throughput":
            return sweep + ["--concurrency", "32"], {"BREEZE_ENGINE_CODEC_TF32": "1",
                                                     "BREEZE_ENGINE_CODEC_COMPILE_SLOTS": "1"}
        if self.name == "kernel-check":
            return [py, str(HERE / "kernel_check.py"), "--device", args.device, "--size", args.size,
                    "--json", str(result), *common], {}
        if self.name == "serve-smoke":
            return [py, str(HERE / "serve_smoke.py"), "--device", args.device, "--json", str(result), *common], {}
        if self.name == "retrieval":
            return [py, str(HERE / "retrieval_bench.py"), "--iterations", "3", "--json", str(result), *common], {}
        raise ValueError(self.name)


STEPS = {step.name: step for step in (
    Step("gpu-tests", 480), Step("engine-bench", 200), Step("engine-bench-fp16", 150), Step("sweep", 240),
    Step("sweep-throughput", 300), Step("kernel-check", 150), Step("serve-smoke", 240), Step("retrieval", 240))}


def run_step(step: Step, args: argparse.Namespace, out: Path, meta: dict) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"device-run-{step.name}-"))
    result_path = work / "result.json"
    argv, env = step.command(args, result_path, work)
    limit = args.limits.get(step.name, step.limit_s)
    print(f"=== {step.name} (limit {limit:.0f} s): {' '.join(argv)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, cwd=bench_env.ROOT,
                            start_new_session=True)  # its own process group: a time limit ends all of it
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    seconds = time.perf_counter() - t0
    record = {"step": step.name, "meta": meta, "argv": argv, "environment": env, "returncode": proc.returncode,
              "timed_out": timed_out, "limit_s": limit, "seconds": seconds,
              "result": _load(result_path), "output_tail": (output or "")[-OUTPUT_TAIL:]}
    if step.name == "gpu-tests":
        record["result"] = pytest_result(work)
    record["ok"] = step_ok(record)
    bench_env.write_json(out / f"{step.name}.json", record)
    print((output or "")[-2500:], flush=True)
    print(f"=== {step.name}: {'ok' if record['ok'] else 'FAILED'} (exit {proc.returncode}"
          f"{', time limit' if timed_out else ''}) after {seconds:.0f} s", flush=True)
    return record


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def pytest_result(work: Path) -> dict:
    """Every test's outcome and seconds from pytest's JUnit XML, and the figures the tests wrote."""
    tests = []
    try:
        root = ET.parse(work / "junit.xml").getroot()
    except (OSError, ET.ParseError):
        root = None
    for case in ([] if root is None else root.iter("testcase")):
        outcome, message = "passed", None
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (found.get("message") or found.text or "")[:1500]
                break
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time") or 0), "message": message})
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "error", "skipped")}
    figures = {p.stem: _load(p) for p in sorted((work / "figures").glob("*.json"))}
    try:  # written as each test fails (tests/gpu/conftest.py): there even when the time limit ended the run
        lines = (work / "figures" / "failures.jsonl").read_text().splitlines()
    except OSError:
        lines = []
    failures = [json.loads(line) for line in lines if line.strip()]
    return {"counts": counts, "tests": tests, "figures": figures, "failures": failures}


def step_ok(record: dict) -> bool:
    if record["timed_out"] or record["returncode"] != 0:
        return False
    if record["step"] == "gpu-tests":
        counts = (record["result"] or {}).get("counts", {})
        return counts.get("failed", 1) == 0 and counts.get("error", 1) == 0
    return record["result"] is not None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/device_run.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", default=DEFAULT_STEPS, help=f"comma list of: {', '.join(STEPS)} (default "
                                                          f"{DEFAULT_STEPS})")
    p.add_argument("--out", required=True, type=Path, help="directory for <step>.json and summary.json")
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (a check of the runner)")
    p.add_argument("--size", default="full", choices=("full", "mid", "tiny"), help="the benchmarks' model size")
    p.add_argument("--precision", default=None,
                   help="the benchmarks' precision (default: bf16 on CUDA, auto elsewhere: fp32 on the CPU)")
    p.add_argument("--frames", type=int, default=None,
                   help="frames per request in the benchmarks (default: 64 batch 1, 48 in the sweeps)")
    p.add_argument("--levels", default="1,8,32", help="the sweep's stream counts")
    p.add_argument("--limit", action="append", default=[], metavar="STEP=SECONDS", help="a step's time limit")
    p.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                   help="an extra argument for the gpu-tests step's pytest (e.g. -k kernels)")
    p.add_argument("--commit", default=None, help="the commit to record (default: $BREEZE_COMMIT, else git)")
    args = p.parse_args(argv)
    names = [s for s in args.steps.split(",") if s]
    unknown = [s for s in names if s not in STEPS]
    if unknown or not names:
        p.error(f"--steps: unknown {unknown}; choose from {', '.join(STEPS)}")
    try:
        args.limits = {k: float(v) for k, v in (item.split("=", 1) for item in args.limit)}
    except ValueError:
        p.error("--limit takes STEP=SECONDS")
    if args.precision is None:
        args.precision = "bf16" if args.device.startswith("cuda") else "auto"
    bench_env.use_source_tree()
    meta = bench_env.describe(args.commit)
    args.commit = meta["commit"]
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"device run: {meta['gpu'] or args.device} (driver {meta['driver']}), torch {meta['torch']}, "
          f"triton {meta['triton']}, commit {meta['commit']}", flush=True)
    t0 = time.perf_counter()
    records = [run_step(STEPS[name], args, args.out, meta) for name in names]
    summary = {"meta": meta, "device": args.device, "size": args.size, "seconds": time.perf_counter() - t0,
               "steps": [{k: r[k] for k in ("step", "ok", "returncode", "timed_out", "seconds")} | {
                   "file": f"{r['step']}.json"} for r in records],
               "ok": all(r["ok"] for r in records)}
    bench_env.write_json(args.out / "summary.json", summary)
    for r in summary["steps"]:
        print(f"{r['step']:18} {'ok' if r['ok'] else 'FAILED':7} {r['seconds']:6.0f} s")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
