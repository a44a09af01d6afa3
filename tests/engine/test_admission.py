"""Admission control through the real `Engine` (engine/service.py) on the CPU: a job whose join (text
encode + prefill) is still running holds its slot, so a burst cannot slip past max_active + max_queue."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ArtifactSettings, EngineSettings
from breeze_worker.engine.service import Engine
from breeze_worker.engine.types import JobFinished, JobStarted, SynthesisRequest
from breeze_worker.errors import ResourceExhausted


@pytest.fixture(scope="module")
def one_slot_engine(tmp_path_factory):
    torch.set_num_threads(1)
    settings = EngineSettings(device="cpu", max_active_streams=1, max_queue=1)
    store = ArtifactStore(ArtifactSettings(directory=tmp_path_factory.mktemp("admission")))
    eng = Engine(settings, store)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.stop())


async def _run(engine, seed: int) -> list:
    return [event async for event in engine.synthesize(SynthesisRequest(text="one two three", seed=seed,
                                                                        max_frames=2))]


def test_a_job_being_joined_holds_its_slot(one_slot_engine, monkeypatch):
    scheduler = one_slot_engine.scheduler
    entered, release = threading.Event(), threading.Event()
    join = scheduler._stepper.join

    def held_join(joiners):  # the first job's join waits here: it is neither queued nor active meanwhile
        entered.set()
        release.wait(30)
        return join(joiners)

    monkeypatch.setattr(scheduler._stepper, "join", held_join)

    async def main():
        first = asyncio.create_task(_run(one_slot_engine, 1))
        assert await asyncio.to_thread(entered.wait, 30)
        assert scheduler.load() == (1, 0)  # the starting job counts as active
        queued = asyncio.create_task(_run(one_slot_engine, 2))
        while scheduler.load()[1] < 1:
            await asyncio.sleep(0.01)
        with pytest.raises(ResourceExhausted, match=r"queue is full \(1 waiting, 1 active streams of max 1\)"):
            await _run(one_slot_engine, 3)
        release.set()
        return await asyncio.wait_for(asyncio.gather(first, queued), 60)

    for events in asyncio.run(main()):  # the two accepted jobs ran to the end
        assert isinstance(events[0], JobStarted) and isinstance(events[-1], JobFinished)
        assert events[-1].stats.frames == 2
    assert scheduler.load() == (0, 0)
