"""A real worker (Engine on the tiny default + grpc.aio servers on port 0) in a background thread, with its
engine in reach, for tests that count what the engine did (decodes, slots)."""

from __future__ import annotations

import asyncio

from shared_loop import shared_loop

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import WorkerSettings
from breeze_worker.engine.service import Engine
from breeze_worker.transport.server import create_server


class InProcessWorker:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.engine: Engine | None = None
        self.servers = None
        self._loop = shared_loop()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.servers.synthesis_port}"

    @property
    def artifact_target(self) -> str:
        return f"127.0.0.1:{self.servers.artifact_port}"

    def _call(self, coro, timeout_s: float = 300):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _start(self) -> None:
        store = ArtifactStore(self.settings.artifacts)
        self.engine = Engine(self.settings.engine, store)
        self.servers = await create_server(self.settings, self.engine, store)
        await self.engine.start()
        await self.servers.set_serving(True)

    async def _stop(self) -> None:
        await self.servers.stop(0.5)
        await self.engine.stop()

    def __enter__(self) -> InProcessWorker:
        self._call(self._start())
        return self

    def __exit__(self, *exc) -> None:
        self._call(self._stop(), 60)
