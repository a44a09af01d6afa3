"""`breeze-worker serve` as a real subprocess (tiny default model, CPU) for the reliability tests: its ready
line, its log, /metrics over HTTP, SIGTERM and kill -9 from outside."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")),
           PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
READY = re.compile(r"breeze-worker ready: synthesis=(\S+):(\d+) artifacts=(\S+):(\d+) model=(.*)")
METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$")


_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections' local ports."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, for a worker that binds it later (and again after a restart). Picked below the
    kernel's range for outgoing connections, since any client socket may take a port from that range as its
    own before the worker binds (a fleet test once failed so), never the same port twice in a process, and
    from a slice of the range of its own in each process of a parallel run (pytest-xdist names them gw0,
    gw1, ...), so two test processes never pick the same port in the seconds before their workers bind."""
    low, rng = 20000, random.Random()
    high = max(low + 1000, _ephemeral_low())
    processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    span = (high - low) // max(processes, 1)
    low, high = low + index * span, low + (index + 1) * span
    for _ in range(500):
        port = rng.randrange(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {low}-{high}")


class ServedWorker:
    """One worker process. Fixed ports (picked free once) so a restart comes back on the same address."""

    def __init__(self, artifact_dir: Path, *args: str, port: int | None = None, artifact_port: int | None = None,
                 host: str = "127.0.0.1", stderr: int | None = None):
        """`stderr`: a file descriptor for the worker's log (a pipe the test reads, or never reads), closed in
        this process once the worker is spawned; by default the log is collected into `log`."""
        self.artifact_dir = artifact_dir
        self.stderr = stderr
        self.host = host
        self.args = list(args)
        self.port = port or free_port()
        self.artifact_port = artifact_port or free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log: list[str] = []

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def artifact_target(self) -> str:
        return f"{self.host}:{self.artifact_port}"

    def command(self) -> list[str]:
        """The worker's command line."""
        return [sys.executable, "-m", "breeze_worker.cli", "serve", "--device", "cpu", "--host", self.host,
                "--metrics-host", "127.0.0.1", "--port", str(self.port),
                "--artifact-port", str(self.artifact_port), "--artifact-dir", str(self.artifact_dir),
                "--metrics-port", str(self.metrics_port), *self.args]

    def start(self, timeout_s: float = 180) -> ServedWorker:
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE if self.stderr is None else self.stderr,
            text=True, env=ENV)
        log = self.log
        if self.stderr is not None:
            os.close(self.stderr)  # the worker has its copy: the pipe ends when it exits
        else:
            threading.Thread(target=lambda p=self.proc: log.extend(p.stderr), daemon=True).start()
        ready: list[str] = []
        reader = threading.Thread(target=lambda p=self.proc: ready.append(p.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        line = ready[0] if ready else ""
        if not READY.match(line.strip()):
            self.stop()  # a worker that never became ready is not left running
            raise AssertionError(f"no ready line, got {line!r}; log: {''.join(self.log)[-3000:]}")
        threading.Thread(target=lambda p=self.proc: [None for _ in p.stdout], daemon=True).start()
        return self

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        values = {}
        for line in text.splitlines():
            match = METRIC.match(line)
            if match and not line.startswith("#"):
                values[match.group(1)] = float(match.group(2))
        return values

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(30)

    def wait(self, timeout_s: float = 60) -> int:
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)  # the second one ends the artifact grace at once
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def logged(self, text: str) -> bool:
        return any(text in line for line in self.log)

    def wait_logged(self, text: str, timeout_s: float = 30) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.logged(text):
                return True
            time.sleep(0.05)
        return False


def start_all(workers: list[ServedWorker], timeout_s: float = 300) -> None:
    """Start several workers at once (each loads and warms its model in its own process)."""
    errors: list[BaseException] = []

    def start(worker: ServedWorker) -> None:
        try:
            worker.start(timeout_s)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 10)
    if errors:  # the workers that did start are stopped too: nothing outlives the failed test
        for worker in workers:
            worker.stop()
    assert not errors, errors
