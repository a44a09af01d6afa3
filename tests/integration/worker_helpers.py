"""The integration tests' worker: the real Engine on the tiny default and real grpc.aio servers on port 0,
on one background event loop thread shared by every such worker (the tests talk to them over real
channels)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from dataclasses import dataclass

from shared_loop import shared_loop

from breeze_client.sdk import BreezeClient
from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import WorkerSettings
from breeze_worker.engine.service import Engine
from breeze_worker.transport.server import create_server

MAX_REQUEST_BYTES = 256 * 1024


@dataclass
class RunningWorker:
    settings: WorkerSettings
    synthesis_port: int
    artifact_port: int
    store: ArtifactStore

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.synthesis_port}"

    @property
    def artifact_target(self) -> str:
        return f"127.0.0.1:{self.artifact_port}"


class WorkerThread:
    """A worker on the shared test loop: `start()` returns once it serves, `stop()` shuts it down."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._done: concurrent.futures.Future | None = None
        self.worker: RunningWorker | None = None

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        store = ArtifactStore(self.settings.artifacts)
        engine = Engine(self.settings.engine, store)
        servers = await create_server(self.settings, engine, store)
        try:
            await engine.start()
            await servers.set_serving(True)
            self.worker = RunningWorker(self.settings, servers.synthesis_port, servers.artifact_port, store)
            self._ready.set()
            await self._stop.wait()
        finally:
            await servers.stop(1.0)
            await engine.stop()

    def start(self, timeout_s: float = 300) -> RunningWorker:
        self._loop = shared_loop()
        self._done = asyncio.run_coroutine_threadsafe(self._main(), self._loop)
        self._done.add_done_callback(lambda _: self._ready.set())  # a failed start wakes start() too
        assert self._ready.wait(timeout_s), "the test worker did not start in time"
        if self._done.done():
            self._done.result()  # raises what the start raised
            raise RuntimeError("the test worker stopped while starting")
        return self.worker

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._done is not None:
            self._done.result(30)


def assert_still_serving(client: BreezeClient) -> None:
    """The worker answers health and runs a short job after a rejected request."""
    assert client.health() == "SERVING"
    result = client.synthesize("Still here.", max_frames=2, seed=1)
    assert result.stats.frames >= 1 and result.artifact is not None
