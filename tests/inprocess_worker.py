"""A real worker inside the test process: the Engine (the tiny embedded default unless the settings name a
model) and the grpc.aio servers of `create_server`, on the session's one worker loop (shared_loop.py), so
synchronous SDK code in the test talks to it over real channels and the test can still reach its engine and
store. The integration, reliability and retrieval tests and benchmarks/retrieval_bench.py use it.

    with InProcessWorker(settings) as worker:
        BreezeClient(worker.target).synthesize(...)
"""

from __future__ import annotations

import asyncio

from shared_loop import shared_loop

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import WorkerSettings
from breeze_worker.engine.service import Engine
from breeze_worker.transport.server import create_server


class InProcessWorker:
    """`start()` (or `with`) returns once the worker serves; `stop()` stops its servers, then its engine.
    `engine_factory(engine_settings, store)` replaces the real Engine (a test's stand-in)."""

    def __init__(self, settings: WorkerSettings, *, engine_factory=None) -> None:
        self.settings = settings
        self._engine_factory = engine_factory or Engine
        self._loop = shared_loop()
        self.store: ArtifactStore | None = None
        self.engine = None
        self.servers = None

    @property
    def synthesis_port(self) -> int:
        return self.servers.synthesis_port

    @property
    def artifact_port(self) -> int:
        return self.servers.artifact_port

    @property
    def target(self) -> str:
        return f"{self.settings.server.host}:{self.synthesis_port}"

    @property
    def artifact_target(self) -> str:
        return f"{self.settings.server.host}:{self.artifact_port}"

    def _call(self, coro, timeout_s: float):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _start(self) -> None:
        self.store = ArtifactStore(self.settings.artifacts)
        self.engine = self._engine_factory(self.settings.engine, self.store)
        self.servers = await create_server(self.settings, self.engine, self.store)
        await self.engine.start()
        await self.servers.set_serving(True)

    async def _stop(self) -> None:
        if self.servers is not None:
            await self.servers.stop(0.5)
        if self.engine is not None:
            await self.engine.stop()
        if self.store is not None:
            self.store.close()  # the directory's lock: a restart on it opens a new store

    def start(self, timeout_s: float = 300) -> InProcessWorker:
        try:
            self._call(self._start(), timeout_s)
        except BaseException:
            self.stop()  # what did start (a port, the engine thread) must not outlive the failed start
            raise
        return self

    def stop(self, timeout_s: float = 60) -> None:
        self._call(self._stop(), timeout_s)

    def __enter__(self) -> InProcessWorker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
