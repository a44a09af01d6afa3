"""The batched engine through the real `Engine` (engine/service.py) on the CPU (fast path = batched
stepper, tiny model with its codec): concurrent streams get exactly the audio they get alone, a full queue
answers RESOURCE_EXHAUSTED naming the limit, and a cancelled stream frees its slot at the next step."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch
from engine_helpers import spy_frames_by_seed

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ArtifactSettings, EngineSettings
from breeze_worker.engine.service import Engine
from breeze_worker.engine.types import AudioChunk, JobFinished, JobStarted, PcmEncoding, SynthesisRequest
from breeze_worker.errors import ResourceExhausted

MAX_ACTIVE = 3


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    torch.set_num_threads(1)
    settings = EngineSettings(device="cpu", fast_path="fast", max_active_streams=MAX_ACTIVE, max_queue=1)
    store = ArtifactStore(ArtifactSettings(directory=tmp_path_factory.mktemp("artifacts")))
    eng = Engine(settings, store)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.stop())


def _req(text: str, seed: int, frames: int, cfg: bool = False) -> SynthesisRequest:
    return SynthesisRequest(text=text, instruction="calm" if cfg else None, cfg_scale=2.0 if cfg else None,
                            seed=seed, max_frames=frames, encoding=PcmEncoding.F32LE)


async def _collect(engine, request, started: asyncio.Event | None = None) -> tuple[bytes, JobFinished]:
    pcm, finished = b"", None
    async for event in engine.synthesize(request):
        if isinstance(event, JobStarted) and started is not None:
            started.set()
        elif isinstance(event, AudioChunk):
            pcm += event.pcm
        elif isinstance(event, JobFinished):
            finished = event
    return pcm, finished


@pytest.fixture
def frames_by_seed(engine, monkeypatch):
    """Record the frames the stepper hands the scheduler, per request seed (the engine emits only PCM)."""
    return spy_frames_by_seed(engine.scheduler._stepper, monkeypatch)


def test_concurrent_streams_get_their_frames_alone(engine, frames_by_seed):
    requests = [_req("hello there", 1, 5, cfg=True), _req("a longer sentence than the others here", 2, 7),
                _req("hi", 3, 4, cfg=True)]

    async def main():
        alone = [await _collect(engine, r) for r in requests]
        alone_frames = {seed: list(f) for seed, f in frames_by_seed.items()}
        frames_by_seed.clear()
        steps_before = engine.scheduler.steps
        together = await asyncio.gather(*(_collect(engine, r) for r in requests))
        return alone, alone_frames, together, engine.scheduler.steps - steps_before

    alone, alone_frames, together, steps = asyncio.run(main())
    for (pcm_alone, fin_alone), (pcm_batched, fin_batched), req in zip(alone, together, requests):
        assert fin_batched.stats.frames == req.max_frames == fin_alone.stats.frames
        got, want = frames_by_seed[req.seed], alone_frames[req.seed]
        assert len(got) == len(want) == req.max_frames
        assert all(torch.equal(a, b) for a, b in zip(got, want))  # identical frames
        # the codec decoded them in a batch of 3 instead of 1: the same audio up to float rounding
        a = np.frombuffer(pcm_alone, "<f4")
        b = np.frombuffer(pcm_batched, "<f4")
        assert a.shape == b.shape == (req.max_frames * 1920,) and np.abs(a - b).max() < 1e-4
    assert steps < sum(r.max_frames for r in requests)  # they shared steps


def test_full_queue_is_resource_exhausted_and_a_cancelled_stream_frees_its_slot(engine):
    async def main():
        started = [asyncio.Event() for _ in range(MAX_ACTIVE)]
        long_jobs = [asyncio.create_task(_collect(engine, _req("keeps going", 10 + i, 400), started[i]))
                     for i in range(MAX_ACTIVE)]
        for event in started:
            await asyncio.wait_for(event.wait(), 60)
        waiting_started = asyncio.Event()
        waiting = asyncio.create_task(_collect(engine, _req("waits for a slot", 20, 2), waiting_started))
        while engine.scheduler.load()[1] < 1:
            await asyncio.sleep(0.01)
        with pytest.raises(ResourceExhausted, match="queue is full"):
            await _collect(engine, _req("one too many", 21, 2))
        assert not waiting_started.is_set()
        steps_at_cancel = engine.scheduler.steps
        long_jobs[0].cancel()  # the caller goes away: its slot is free at the next step
        await asyncio.wait_for(waiting_started.wait(), 60)
        steps_to_start = engine.scheduler.steps - steps_at_cancel
        pcm, finished = await asyncio.wait_for(waiting, 60)
        for task in long_jobs[1:]:
            task.cancel()
        await asyncio.gather(*long_jobs, return_exceptions=True)
        return steps_to_start, finished

    steps_to_start, finished = asyncio.run(main())
    assert steps_to_start <= 2, steps_to_start
    assert finished.stats.frames == 2
    deadline = time.monotonic() + 10  # the other two were cancelled too: their slots come back
    while engine.scheduler._stepper.free_slots < MAX_ACTIVE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.scheduler._stepper.free_slots == MAX_ACTIVE and engine.scheduler.load() == (0, 0)
