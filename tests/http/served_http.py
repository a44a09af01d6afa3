"""`breeze-worker serve --http-port 0` as a subprocess (tiny default model, CPU): the HTTP face as a user starts it,
found from its log line `HTTP face on http://HOST:PORT/`, with the gRPC ports from the ready line.

    with ServedHttp(tmp_path, "--token", "T") as worker:
        worker.url("/health"), worker.target, worker.artifact_target
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")),
           PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
READY = re.compile(r"breeze-worker ready: synthesis=(\S+):(\d+) artifacts=(\S+):(\d+)")
HTTP_LINE = re.compile(r"HTTP face on (https?)://(\S+):(\d+)/")
METRICS_LINE = re.compile(r"metrics on http://(\S+):(\d+)/metrics")


class ServedHttp:
    def __init__(self, artifact_dir: Path, *args: str) -> None:
        self.command = [sys.executable, "-m", "breeze_worker.cli", "serve", "--device", "cpu", "--port", "0",
                        "--artifact-port", "0", "--artifact-dir", str(artifact_dir), "--http-port", "0", *args]
        self.proc: subprocess.Popen | None = None
        self._stderr: list[str] = []
        self._lock = threading.Lock()
        self._http = threading.Event()
        self.base = self.target = self.artifact_target = self.metrics_url = ""

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lock:
                self._stderr.append(line)
            metrics = METRICS_LINE.search(line)
            if metrics:
                self.metrics_url = f"http://{metrics.group(1)}:{metrics.group(2)}/metrics"
            found = HTTP_LINE.search(line)
            if found and not self._http.is_set():
                self.base = f"{found.group(1)}://{found.group(2)}:{found.group(3)}"
                self._http.set()
        self._http.set()  # the process ended: stop waiting

    def stderr_text(self) -> str:
        with self._lock:
            return "".join(self._stderr)

    def url(self, path: str) -> str:
        return self.base + path

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    def __enter__(self) -> ServedHttp:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        threading.Thread(target=self._drain, daemon=True).start()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the ready line: both gRPC ports listen and the model is warm
        match = READY.match(line.strip())
        self._http.wait(120)
        if not match or not self.base:
            self.__exit__()
            raise AssertionError(f"no ready line or HTTP line, got {line!r}; stderr: {self.stderr_text()[-3000:]}")
        self.target = f"127.0.0.1:{match.group(2)}"
        self.artifact_target = f"127.0.0.1:{match.group(4)}"
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
