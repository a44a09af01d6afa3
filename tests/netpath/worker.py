"""An in-process worker on loopback (port 0) for the retrieval tests and the benchmark.

`InProcessWorker` runs `create_server` + the engine on the tiny embedded default (CPU) on the session's
shared worker loop (tests/shared_loop.py, a background thread), so synchronous SDK code can call it.
Fault settings are the worker's test-only ArtifactSettings fields and can be changed between runs
(`set_faults`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import threading
from pathlib import Path

from shared_loop import shared_loop


class InProcessWorker:
    def __init__(self, artifact_dir: str | Path | None = None, *, host: str = "127.0.0.1", engine_factory=None,
                 **artifact_settings):
        self.host = host
        self._engine_factory = engine_factory  # (EngineSettings, store) -> engine; default: the real Engine
        self._tmp = None if artifact_dir else tempfile.TemporaryDirectory(prefix="breeze-artifacts-")
        self.artifact_dir = Path(artifact_dir or self._tmp.name)
        self._artifact_settings = artifact_settings
        self._loop = shared_loop()
        self.servers = self.engine = self.store = None

    @property
    def target(self) -> str:
        return f"{self.host}:{self.servers.synthesis_port}"

    @property
    def artifact_target(self) -> str:
        return f"{self.host}:{self.servers.artifact_port}"

    def _call(self, coro, timeout: float = 300.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> None:
        from breeze_worker.artifacts.store import ArtifactStore
        from breeze_worker.config import ArtifactSettings, EngineSettings, ServerSettings, WorkerSettings
        from breeze_worker.engine.service import Engine
        from breeze_worker.transport.server import create_server

        settings = WorkerSettings(
            engine=EngineSettings(device="cpu"),
            # the free-space headroom scaled to the tests' small volumes (a 64 MB loop device)
            artifacts=ArtifactSettings(directory=self.artifact_dir, **{"min_free_bytes": 1 << 20,
                                                                      **self._artifact_settings}),
            server=ServerSettings(host=self.host, port=0, artifact_port=0, grace_s=0.5),
        ).validate()
        self.store = ArtifactStore(settings.artifacts)
        self.engine = (self._engine_factory or Engine)(settings.engine, self.store)
        self.servers = await create_server(settings, self.engine, self.store)
        await self.engine.start()
        await self.servers.set_serving(True)

    def set_faults(self, *, commit_delay_s: float = 0.0, first_byte_delay_s: float = 0.0,
                   storage_read_bytes_per_s: float = 0.0, storage_write_bytes_per_s: float = 0.0) -> None:
        """Change the store's test-only fault settings (0 = off) for the following jobs and fetches."""
        self.store.settings = dataclasses.replace(
            self.store.settings, fault_commit_delay_s=commit_delay_s, fault_first_byte_delay_s=first_byte_delay_s,
            fault_storage_read_bytes_per_s=storage_read_bytes_per_s,
            fault_storage_write_bytes_per_s=storage_write_bytes_per_s)

    def __enter__(self) -> InProcessWorker:
        try:
            self._call(self._start())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        async def stop():
            if self.servers is not None:
                await self.servers.stop(0.5)
            if self.engine is not None:
                await self.engine.stop()
        try:
            self._call(stop(), timeout=60)
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
             "--artifact-port", "0", "--artifact-dir", str(self.artifact_dir), "--device", "cpu", *self.args],
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
