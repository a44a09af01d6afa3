"""Every engine step is timed into breeze_step_seconds; a step over the slow threshold is logged with the number
of streams that waited and counted in breeze_slow_steps_total (an operator's view of a stall)."""

from __future__ import annotations

import asyncio
import logging

import torch

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ArtifactSettings, EngineSettings
from breeze_worker.engine import scheduler as scheduler_module
from breeze_worker.engine.service import Engine
from breeze_worker.engine.types import JobFinished, SynthesisRequest


def _synthesize(engine, request) -> JobFinished:
    async def run():
        finished = None
        async for event in engine.synthesize(request):
            if isinstance(event, JobFinished):
                finished = event
        return finished
    return asyncio.run(run())


def test_steps_are_timed_and_slow_ones_counted(tmp_path, monkeypatch, caplog):
    torch.set_num_threads(1)
    engine = Engine(EngineSettings(device="cpu", max_active_streams=2, max_queue=2),
                    ArtifactStore(ArtifactSettings(directory=tmp_path)))
    asyncio.run(engine.start())
    try:
        assert _synthesize(engine, SynthesisRequest(text="timed steps", seed=1, max_frames=3)) is not None
        text = engine.metrics.render()
        steps = next(line for line in text.splitlines() if line.startswith("breeze_step_seconds_count"))
        assert float(steps.split()[-1]) >= 3  # one per frame at least
        assert "breeze_slow_steps_total 0.0" in text

        monkeypatch.setattr(scheduler_module, "SLOW_STEP_S", 0.0)  # every step counts as slow now
        with caplog.at_level(logging.WARNING, logger="breeze_worker.engine.scheduler"):
            assert _synthesize(engine, SynthesisRequest(text="slow steps", seed=2, max_frames=2)) is not None
        slow = float(next(line for line in engine.metrics.render().splitlines()
                          if line.startswith("breeze_slow_steps_total")).split()[-1])
        assert slow >= 2
        warnings = [r.getMessage() for r in caplog.records if "engine step for 1 stream(s) took" in r.getMessage()]
        assert len(warnings) == 1  # one warning per minute, however many steps were slow
    finally:
        asyncio.run(engine.stop())
