#!/usr/bin/env python3
"""The serve smoke: the whole product once, end to end, on a device. `breeze-worker serve` (the tiny embedded
default unless `--model`) on ports 0, then the client as a user runs it: `breeze-client synth --stream` plain
and with an instruction and CFG, `breeze-client fetch` of the first job's artifact, a 4-client
`breeze-client bench`; then SIGTERM. Measured: the worker's time to ready, each command's exit status, wall
time and JSON output (TTFA, RTF, the artifact's retrieval timestamps, the bench's figures), whether each WAV
written is a valid 24 kHz file with the streamed samples, and the worker's exit status after SIGTERM.
`--worker-env NAME=VALUE` (repeatable) runs the worker with settings from the environment (e.g.
BREEZE_ENGINE_CODEC_TF32=0 for a strict-FP32 codec). Exits 1 if any step failed; `--json FILE` writes everything.

The worker and the client need grpcio, protobuf and zstandard; a host without them takes them as wheels on
PYTHONPATH (the device's notes say how).

    python benchmarks/serve_smoke.py --device cuda --json smoke.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import wave
from pathlib import Path

import bench_env

READY = "breeze-worker ready:"


class Worker:
    """`breeze-worker serve` in a child process; its output kept (the last lines go into the report)."""

    def __init__(self, device: str, model: str | None, artifact_dir: Path, env: dict[str, str]):
        argv = [sys.executable, "-m", "breeze_worker.cli", "serve", "--device", device, "--host", "127.0.0.1",
                "--port", "0", "--artifact-port", "0", "--artifact-dir", str(artifact_dir)]
        if model:
            argv += ["--model", model]
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **env})
        self.lines: list[str] = []
        self.ready_line: str | None = None
        self.ready_s: float | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if line.startswith(READY) and self.ready_line is None:
                self.ready_line, self.ready_s = line.strip(), time.perf_counter() - self.started
                self._ready.set()
        self._ready.set()  # the process ended (ready or not)

    def wait_ready(self, timeout_s: float) -> bool:
        self._ready.wait(timeout_s)
        return self.ready_line is not None

    @property
    def target(self) -> str:
        fields = dict(part.split("=", 1) for part in self.ready_line.split() if "=" in part)
        return fields["synthesis"]

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return self.proc.returncode


def client(args: list[str], target: str, timeout_s: float) -> dict:
    """One `breeze-client` command with --json: exit status, seconds, its JSON (or its output's tail)."""
    argv = [sys.executable, "-m", "breeze_client.cli", *args, "--target", target, "--json", "-"]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        returncode, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        returncode, out, err = None, exc.stdout or "", f"timed out after {timeout_s} s"
    step = {"argv": ["breeze-client", *args], "returncode": returncode, "seconds": time.perf_counter() - t0}
    try:
        step["json"] = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        step["json"] = None
        step["stdout_tail"] = out[-2000:] if isinstance(out, str) else ""
    if returncode != 0:
        step["stderr_tail"] = (err if isinstance(err, str) else "")[-2000:]
    return step


def wav_summary(path: Path) -> dict:
    """Whether `path` is a readable PCM WAV and what it holds."""
    try:
        with wave.open(str(path), "rb") as f:
            return {"valid": True, "sample_rate": f.getframerate(), "channels": f.getnchannels(),
                    "sample_width": f.getsampwidth(), "frames": f.getnframes(), "bytes": path.stat().st_size}
    except (OSError, EOFError, wave.Error) as exc:
        return {"valid": False, "error": f"{type(exc).__name__}: {exc}"}


def artifact_id(result: dict | None) -> str | None:
    if not result:
        return None
    artifact = result.get("artifact") or {}
    return result.get("artifact_id") or artifact.get("artifact_id")


def run(args: argparse.Namespace, out_dir: Path) -> dict:
    env = dict(item.split("=", 1) for item in args.worker_env)
    report = {"meta": bench_env.describe(args.commit), "device": args.device, "model": args.model or "tiny default",
              "worker_env": env, "steps": {}}
    worker = Worker(args.device, args.model, out_dir / "artifacts", env)
    try:
        if not worker.wait_ready(args.ready_s):
            report["worker"] = {"ready": False, "log_tail": worker.lines[-60:]}
            return report
        target = worker.target
        report["worker"] = {"ready": True, "ready_s": worker.ready_s, "ready_line": worker.ready_line}
        steps = report["steps"]
        plain, cfg = out_dir / "plain.wav", out_dir / "cfg.wav"
        steps["synth_plain"] = client(["synth", "Hello from the GPU.", "--stream", "-o", str(plain), "--seed", "7",
                                       "--max-frames", str(args.frames)], target, args.step_timeout_s)
        steps["synth_plain"]["wav"] = wav_summary(plain)
        steps["synth_cfg"] = client(["synth", "Softly now.", "--instruction", "Whisper.", "--cfg-scale", "1.5",
                                     "--seed", "7", "--stream", "-o", str(cfg), "--max-frames", str(args.frames)],
                                    target, args.step_timeout_s)
        steps["synth_cfg"]["wav"] = wav_summary(cfg)
        artifact = artifact_id(steps["synth_plain"]["json"])
        if artifact:
            fetched = out_dir / "fetched.wav"
            steps["fetch"] = client(["fetch", artifact, "-o", str(fetched)], target, args.step_timeout_s)
            steps["fetch"]["wav"] = wav_summary(fetched)
            steps["fetch"]["same_bytes_as_stream"] = fetched.exists() and plain.exists() and (
                fetched.read_bytes() == plain.read_bytes())
        else:
            steps["fetch"] = {"returncode": None, "error": "the plain synth gave no artifact id"}
        steps["bench"] = client(["bench", "--labels", "short,chunk-4.80s", "--frames", str(args.frames),
                                 "--iterations", "2", "--concurrency", "4"], target, args.step_timeout_s)
    finally:
        report.setdefault("worker", {})["exit_code_after_sigterm"] = worker.stop()
        report["worker"]["log_tail"] = worker.lines[-25:]
    return report


def ok(report: dict) -> bool:
    steps = report["steps"]
    wavs = [s["wav"] for s in steps.values() if "wav" in s]
    return (report["worker"].get("ready", False) and report["worker"].get("exit_code_after_sigterm") == 0
            and len(steps) == 4 and all(s.get("returncode") == 0 for s in steps.values())
            and len(wavs) == 3 and all(w["valid"] and w.get("frames", 0) > 0 for w in wavs)
            and steps["fetch"].get("same_bytes_as_stream", False))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/serve_smoke.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="the worker's --device (cuda, cuda:N, cpu)")
    p.add_argument("--model", default=None, help="checkpoint directory (default: the tiny embedded default)")
    p.add_argument("--frames", type=int, default=24, help="frame limit of each request")
    p.add_argument("--ready-s", type=float, default=180.0, help="seconds to wait for the worker to be ready")
    p.add_argument("--step-timeout-s", type=float, default=180.0, help="seconds each client command may take")
    p.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of the worker (its settings, e.g. BREEZE_ENGINE_CODEC_TF32=1)")
    p.add_argument("--commit", default=None, help="commit to record (default: $BREEZE_COMMIT, else git)")
    p.add_argument("--json", default=None, help="write the report here")
    args = p.parse_args(argv)
    bad = [item for item in args.worker_env if "=" not in item]
    if bad:
        p.error(f"--worker-env takes NAME=VALUE, not {bad}")
    bench_env.use_source_tree()
    with tempfile.TemporaryDirectory(prefix="breeze-serve-smoke-") as tmp:
        report = run(args, Path(tmp))
    report["ok"] = ok(report)
    for name, step in report["steps"].items():
        print(f"{name:12} exit {step.get('returncode')}  {step.get('seconds', 0):6.2f} s  "
              f"{json.dumps(step.get('wav', '')) if step.get('wav') else ''}", flush=True)
    print(f"worker ready in {report['worker'].get('ready_s')} s, exit after SIGTERM "
          f"{report['worker'].get('exit_code_after_sigterm')}: {'OK' if report['ok'] else 'FAILED'}")
    if args.json:
        bench_env.write_json(args.json, report)
        print(f"wrote {args.json}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
