"""Fixtures for the integration tests: one real worker per session (tests/inprocess_worker.py).

Loading and warming the tiny model takes seconds, so the worker starts once. It runs one stream at a
time (max_active_streams=1) so the cancellation test can see a slot being freed, and accepts requests
up to 256 KiB so the oversized-request test stays small.
"""

from __future__ import annotations

import pytest
from inprocess_worker import InProcessWorker
from worker_helpers import MAX_REQUEST_BYTES

from breeze_client.sdk import BreezeClient
from breeze_worker.config import ArtifactSettings, EngineSettings, ServerSettings, WorkerSettings


@pytest.fixture(scope="session")
def worker(tmp_path_factory) -> InProcessWorker:
    settings = WorkerSettings(
        engine=EngineSettings(device="cpu", max_active_streams=1),
        artifacts=ArtifactSettings(directory=tmp_path_factory.mktemp("artifacts")),
        server=ServerSettings(port=0, artifact_port=0, max_request_bytes=MAX_REQUEST_BYTES),
    )
    with InProcessWorker(settings) as running:
        yield running


@pytest.fixture
def client(worker) -> BreezeClient:
    with BreezeClient(worker.target, timeout_s=120) as c:
        yield c
