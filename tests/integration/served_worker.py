"""`breeze-worker serve` as a subprocess on loopback, for tests that look at it from outside (its log, its ports).

    with ServedWorker(tmp_path, "--log-format", "json", "--token", "a-test-token-of-16-chars") as worker:
        worker.target, worker.artifact_target, worker.metrics_port, worker.stderr_text()
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")),
           PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
READY = re.compile(r"breeze-worker ready: synthesis=(\S+):(\d+) artifacts=(\S+):(\d+) model=(.*)")
METRICS = re.compile(r"metrics on http://(\S+):(\d+)/metrics")


def worker_command(*args: str) -> list[str]:
    """The worker's command line, global options (--log-format ...) first."""
    return [sys.executable, "-m", "breeze_worker.cli", *args]


class ServedWorker:
    def __init__(self, artifact_dir: Path, *args: str, host: str = "127.0.0.1") -> None:
        # no artifact grace at the stop unless `args` set one (a later flag wins): nothing fetches then
        self.command = worker_command("serve", "--device", "cpu", "--host", host, "--port", "0",
                                      "--artifact-port", "0", "--artifact-dir", str(artifact_dir),
                                      "--artifact-grace-s", "0", *args)
        self.host = host
        self.proc: subprocess.Popen | None = None
        self._stderr: list[str] = []
        self._lock = threading.Lock()
        self.target = self.artifact_target = self.ready_line = ""
        self.metrics_port: int | None = None
        self.metrics_host: str | None = None

    def _drain(self) -> None:
        for line in self.proc.stderr:
            with self._lock:
                self._stderr.append(line)

    def stderr_lines(self) -> list[str]:
        with self._lock:
            return list(self._stderr)

    def stderr_text(self) -> str:
        return "".join(self.stderr_lines())

    def stderr_bytes(self) -> int:
        return sum(len(line.encode()) for line in self.stderr_lines())

    def __enter__(self) -> ServedWorker:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=ENV)
        threading.Thread(target=self._drain, daemon=True).start()
        line = self.proc.stdout.readline()  # blocks until ready (or the process dies)
        self.ready_line = line.strip()
        match = READY.match(self.ready_line)
        if not match:
            self.__exit__()
            raise AssertionError(f"no ready line, got {line!r}; stderr: {self.stderr_text()[-3000:]}")
        self.target = f"{self.host}:{match.group(2)}"
        self.artifact_target = f"{self.host}:{match.group(4)}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "--metrics-port" in self.command:
            found = METRICS.search(self.stderr_text())
            if found:
                self.metrics_host, self.metrics_port = found.group(1), int(found.group(2))
                break
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
