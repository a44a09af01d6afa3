"""Concurrent streams through the real gRPC server on the batched engine (fast path on the CPU, tiny model):
four callers at once, CFG and not, each gets the audio it gets alone; their jobs ran side by side."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from inprocess_worker import InProcessWorker
from worker_helpers import MAX_REQUEST_BYTES

from breeze_client.sdk import BreezeClient
from breeze_worker.config import ArtifactSettings, EngineSettings, ServerSettings, WorkerSettings

REQUESTS = [
    dict(text="Hello there.", seed=1, max_frames=6, instruction="calm", cfg_scale=2.0),
    dict(text="A longer sentence than the other ones.", seed=2, max_frames=9),
    dict(text="Hi.", seed=3, max_frames=4, instruction="bright", cfg_scale=1.5),
    dict(text="Plain words.", seed=4, max_frames=7),
]


@pytest.fixture(scope="module")
def batched_worker(tmp_path_factory):
    settings = WorkerSettings(
        engine=EngineSettings(device="cpu", fast_path="fast", max_active_streams=4, max_queue=4),
        artifacts=ArtifactSettings(directory=tmp_path_factory.mktemp("artifacts-batched")),
        server=ServerSettings(port=0, artifact_port=0, max_request_bytes=MAX_REQUEST_BYTES),
    )
    with InProcessWorker(settings) as running:
        yield running


def _synthesize(target: str, options: dict):
    with BreezeClient(target, timeout_s=120) as client:
        return client.synthesize(options["text"], encoding="f32le",
                                 **{k: v for k, v in options.items() if k != "text"})


def test_concurrent_grpc_streams_get_the_audio_they_get_alone(batched_worker):
    target = batched_worker.target
    alone = [_synthesize(target, options) for options in REQUESTS]
    with ThreadPoolExecutor(len(REQUESTS)) as pool:
        together = list(pool.map(lambda o: _synthesize(target, o), REQUESTS))
    for a, b, options in zip(alone, together, REQUESTS):
        assert a.stats.frames == b.stats.frames == options["max_frames"]
        assert b.job.cfg_scale == options.get("cfg_scale", 1.0)
        x, y = np.frombuffer(a.audio, "<f4"), np.frombuffer(b.audio, "<f4")
        # same frames; the batched codec rounds differently from a batch of one, nothing more
        assert x.shape == y.shape == (options["max_frames"] * 1920,) and np.abs(x - y).max() < 1e-4
        assert b.artifact is not None
    # the jobs overlapped in time: each started before the slowest one finished
    done = max(r.timing.server_done_ns for r in together)
    assert all(r.timing.server_started_ns < done for r in together)
    assert min(r.timing.server_done_ns for r in together) > max(r.timing.server_started_ns for r in together)
