"""The retrieval tests' and benchmark's workers on loopback (port 0), the tiny embedded default on the CPU.

`InProcessWorker` is tests/inprocess_worker.py's worker with the artifact settings these tests vary: its own
artifact directory (a temporary one by default) and the store's test-only fault settings, which can change
between runs (`set_faults`). `WorkerProcess` is `breeze-worker serve` as a subprocess.
"""

from __future__ import annotations

import dataclasses
import tempfile
import threading
from pathlib import Path

import inprocess_worker

from breeze_worker.config import ArtifactSettings, EngineSettings, ServerSettings, WorkerSettings


class InProcessWorker(inprocess_worker.InProcessWorker):
    def __init__(self, artifact_dir: str | Path | None = None, *, host: str = "127.0.0.1", engine_factory=None,
                 **artifact_settings):
        self._tmp = None if artifact_dir else tempfile.TemporaryDirectory(prefix="breeze-artifacts-")
        self.artifact_dir = Path(artifact_dir or self._tmp.name)
        settings = WorkerSettings(
            engine=EngineSettings(device="cpu"),
            # the free-space headroom scaled to the tests' small volumes (a 64 MB loop device)
            artifacts=ArtifactSettings(directory=self.artifact_dir, **{"min_free_bytes": 1 << 20,
                                                                      **artifact_settings}),
            server=ServerSettings(host=host, port=0, artifact_port=0, grace_s=0.5),
        ).validate()
        super().__init__(settings, engine_factory=engine_factory)

    def set_faults(self, *, commit_delay_s: float = 0.0, first_byte_delay_s: float = 0.0,
                   storage_read_bytes_per_s: float = 0.0, storage_write_bytes_per_s: float = 0.0) -> None:
        """Change the store's test-only fault settings (0 = off) for the following jobs and fetches."""
        self.store.settings = dataclasses.replace(
            self.store.settings, fault_commit_delay_s=commit_delay_s, fault_first_byte_delay_s=first_byte_delay_s,
            fault_storage_read_bytes_per_s=storage_read_bytes_per_s,
            fault_storage_write_bytes_per_s=storage_write_bytes_per_s)

    def stop(self, timeout_s: float = 60) -> None:
        try:
            super().stop(timeout_s)
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()


class WorkerProcess:
    """`breeze-worker serve` as a subprocess on loopback with ports 0 (tiny embedded default, CPU).

    `env` adds environment variables, `python_path` directories before the repository's on its
    PYTHONPATH (e.g. a test-only sitecustomize), `args` more `serve` flags.
    """

    def __init__(self, artifact_dir: str | Path | None = None, *, host: str = "127.0.0.1",
                 startup_timeout_s: float = 300.0, env: dict[str, str] | None = None,
                 python_path: list[str | Path] = (), args: list[str] = ()) -> None:
        self.host = host
        self.env, self.python_path, self.args = dict(env or {}), [str(p) for p in python_path], list(args)
        self._tmp = None if artifact_dir else tempfile.TemporaryDirectory(prefix="breeze-artifacts-")
        self.artifact_dir = Path(artifact_dir or self._tmp.name)
        self.startup_timeout_s = startup_timeout_s
        self.proc = None
        self.target = self.artifact_target = ""

    def __enter__(self) -> WorkerProcess:
        import os
        import subprocess
        import sys

        root = Path(__file__).resolve().parents[2]
        path = self.python_path + [str(root / d) for d in ("worker", "client", "protos")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **self.env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "breeze_worker.cli", "serve", "--host", self.host, "--port", "0",
             "--artifact-port", "0", "--artifact-dir", str(self.artifact_dir), "--device", "cpu",
             "--artifact-grace-s", "0", *self.args],  # its stop waits for nothing (a later flag may set one)
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        timer = threading.Timer(self.startup_timeout_s, self.proc.kill)
        timer.start()
        try:
            for line in self.proc.stdout:  # "breeze-worker ready: synthesis=H:P artifacts=H:P model=..."
                if line.startswith("breeze-worker ready:"):
                    fields = dict(part.split("=", 1) for part in line.split()[2:4])
                    self.target, self.artifact_target = fields["synthesis"], fields["artifacts"]
                    return self
        finally:
            timer.cancel()
        self.__exit__()
        raise RuntimeError(f"breeze-worker serve exited ({self.proc.returncode}) before it was ready")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - a stuck worker is killed
                self.proc.kill()
        if self._tmp is not None:
            self._tmp.cleanup()
