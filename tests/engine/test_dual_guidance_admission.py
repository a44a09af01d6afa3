"""Admission counts model rows, through the real `Engine` on the CPU (batched stepper, tiny model with its codec):
two slots hold four rows, so beside a running CFG stream (two rows) a request with two guidance scales (three)
waits in the queue although a slot is free, starts once the rows are free, and is refused with
RESOURCE_EXHAUSTED naming the rows when it waits longer than the queue allows; the running stream is untouched."""

from __future__ import annotations

import asyncio

import pytest
import torch
from engine_helpers import tone_wav

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ArtifactSettings, EngineSettings
from breeze_worker.engine.service import Engine
from breeze_worker.engine.types import AudioChunk, JobFinished, JobStarted, ReferenceInput, SynthesisRequest
from breeze_worker.errors import ResourceExhausted

REFERENCE = tone_wav(1.2)


@pytest.fixture
def make_engine(tmp_path):
    """make_engine(**engine settings): a started two-slot engine, stopped after the test whatever happens."""
    started = []

    def make(**settings) -> Engine:
        torch.set_num_threads(1)
        engine = Engine(EngineSettings(device="cpu", fast_path="fast", max_active_streams=2, max_queue=2,
                                       **settings), ArtifactStore(ArtifactSettings(directory=tmp_path)))
        asyncio.run(engine.start())
        started.append(engine)
        return engine

    yield make
    for engine in started:
        asyncio.run(engine.stop())


def _guided(seed: int, frames: int) -> SynthesisRequest:
    return SynthesisRequest(text="keeps going for a while", instruction="calm", cfg_scale=2.0, seed=seed,
                            max_frames=frames)


def _directed(seed: int, frames: int) -> SynthesisRequest:
    return SynthesisRequest(text="a directed voice", instruction="calm and slow", seed=seed, max_frames=frames,
                            reference=ReferenceInput(audio=REFERENCE, transcript="a steady tone"),
                            cfg_scale_reference=1.5, cfg_scale_instruction=2.0)


async def _collect(engine, request, started: asyncio.Event | None = None) -> list:
    events = []
    async for event in engine.synthesize(request):
        if isinstance(event, JobStarted) and started is not None:
            started.set()
        events.append(event)
    return events


def test_a_request_with_two_guidance_scales_waits_for_its_rows_then_runs(make_engine):
    engine = make_engine()
    scheduler, stepper = engine.scheduler, engine.scheduler._stepper
    assert stepper.max_rows == 4

    async def main():
        running_started = asyncio.Event()
        running = asyncio.create_task(_collect(engine, _guided(1, 400), running_started))
        await asyncio.wait_for(running_started.wait(), 60)
        directed_started = asyncio.Event()
        directed = asyncio.create_task(_collect(engine, _directed(2, 3), directed_started))
        # its reference decoded, it holds a slot and waits for rows: one slot free in the stepper, two rows
        while not scheduler._prepared:
            await asyncio.sleep(0.01)
        assert stepper.free_slots == 1 and stepper.rows_free == 2 and not directed_started.is_set()
        steps = scheduler.steps
        while scheduler.steps < steps + 3:  # admission passes go by; it keeps waiting
            await asyncio.sleep(0.01)
        assert not directed_started.is_set() and scheduler._prepared
        running.cancel()  # the CFG stream's rows come free at the next step
        events = await asyncio.wait_for(directed, 60)
        await asyncio.gather(running, return_exceptions=True)
        return events

    events = asyncio.run(main())
    started, finished = events[0], events[-1]
    assert isinstance(started, JobStarted) and isinstance(finished, JobFinished)
    p = started.params
    assert p.template.value == "direction" and (p.cfg_scale_reference, p.cfg_scale_instruction) == (1.5, 2.0)
    assert p.cfg_scale == 1.0 and p.branches == 3
    assert finished.stats.frames == 3 and sum(isinstance(e, AudioChunk) for e in events) == 3


def test_waiting_for_rows_longer_than_the_queue_allows_is_resource_exhausted(make_engine):
    engine = make_engine(max_queue_wait_s=0.3)

    async def main():
        running_started = asyncio.Event()
        running = asyncio.create_task(_collect(engine, _guided(3, 400), running_started))
        await asyncio.wait_for(running_started.wait(), 60)
        with pytest.raises(ResourceExhausted, match="free model rows") as refused:
            await asyncio.wait_for(_collect(engine, _directed(4, 3)), 60)
        # the same audio again is held already: this one waits in the queue proper (its params are set at once)
        assert engine.references.cached(REFERENCE, "a steady tone") is not None
        with pytest.raises(ResourceExhausted, match="free model rows") as again:
            await asyncio.wait_for(_collect(engine, _directed(5, 3)), 60)
        assert not running.done()  # the running stream went on
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        return refused.value, again.value

    first, second = asyncio.run(main())
    for refusal in (first, second):
        assert "3 free model rows" in str(refusal) and "two guidance scales 3" in str(refusal)
        assert "max_queue_wait_s=0.3" in str(refusal)
    # the rows come back: a request with two guidance scales now runs at once
    events = asyncio.run(_collect(engine, _directed(6, 2)))
    assert isinstance(events[-1], JobFinished) and events[-1].stats.frames == 2
