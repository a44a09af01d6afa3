"""Fixtures for transport tests: the real grpc.aio servers on port 0 around an engine double."""

from __future__ import annotations

import pytest_asyncio
from fake_engine import FakeEngine
from transport_helpers import worker_settings

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.transport.server import create_server


@pytest_asyncio.fixture
async def fake_worker(tmp_path):
    """(servers, engine): a started pair of servers around a FakeEngine."""
    settings = worker_settings(tmp_path)
    store = ArtifactStore(settings.artifacts)
    engine = FakeEngine(store, frame_delay_s=0.01)
    servers = await create_server(settings, engine, store)
    yield servers, engine
    await servers.stop(0)
