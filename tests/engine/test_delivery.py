"""How a step's audio leaves the engine thread (engine/scheduler.py `_deliver`, engine/session.py `post`): every
stream's chunk of a step reaches the event loop through one wake-up, encoded from one pass over the step's rows,
with the bytes each stream would get alone; and the worker's interpreter settings (commands/serve.py)."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading

import numpy as np
import torch

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ArtifactSettings, EngineSettings, ServerSettings
from breeze_worker.engine.metrics import EngineMetrics
from breeze_worker.engine.service import Engine
from breeze_worker.engine.session import encode_pcm
from breeze_worker.engine.types import AudioChunk, PcmEncoding, SynthesisRequest


def test_a_step_wakes_the_event_loop_once_for_all_its_streams(tmp_path):
    torch.set_num_threads(1)
    engine = Engine(EngineSettings(device="cpu", fast_path="fast", max_active_streams=4, max_queue=4),
                    ArtifactStore(ArtifactSettings(directory=tmp_path)))
    requests = [SynthesisRequest(text=f"stream number {i}", seed=i, max_frames=12,
                                 encoding=PcmEncoding.F32LE if i % 2 else PcmEncoding.S16LE) for i in range(4)]

    async def main():
        await engine.start()
        loop = asyncio.get_running_loop()
        wakeups = []
        original = loop.call_soon_threadsafe

        def counted(callback, *args, **kwargs):
            if threading.current_thread().name == "breeze-engine":
                wakeups.append(callback)
            return original(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counted

        async def one(request):
            return [e for e in [event async for event in engine.synthesize(request)] if isinstance(e, AudioChunk)]

        try:
            return await asyncio.gather(*(one(r) for r in requests)), wakeups
        finally:
            await engine.stop()

    chunks, wakeups = asyncio.run(main())
    total = sum(len(c) for c in chunks)
    assert total == 4 * 12  # one chunk a frame
    for request, got in zip(requests, chunks):
        width = 4 if request.encoding is PcmEncoding.F32LE else 2
        assert [c.num_samples for c in got] == [1920] * 12 and all(len(c.pcm) == 1920 * width for c in got)
        assert [c.sequence for c in got] == list(range(12))
    # a wake-up per step for all its chunks, plus a few per job (started, final, end): not one per chunk
    assert len(wakeups) <= engine.scheduler.steps + 4 * len(requests) < total + 4 * len(requests)


def test_a_step_encoded_at_once_gives_each_row_its_own_bytes():
    rows = np.random.default_rng(0).uniform(-1.2, 1.2, size=(5, 1920)).astype(np.float32)
    for encoding, width in ((PcmEncoding.S16LE, 2), (PcmEncoding.F32LE, 4)):
        whole = encode_pcm(rows, encoding)
        for i, row in enumerate(rows):
            assert whole[i * 1920 * width:(i + 1) * 1920 * width] == encode_pcm(row, encoding)


def test_the_worker_tunes_its_interpreter_once_warm():
    from breeze_worker.commands.serve import tune_interpreter

    interval, callbacks = sys.getswitchinterval(), list(gc.callbacks)
    metrics = EngineMetrics()
    try:
        tune_interpreter(ServerSettings(switch_interval_ms=0.5, gc_freeze=True), metrics)
        assert sys.getswitchinterval() == 0.0005
        assert gc.get_freeze_count() > 1000  # this test process's objects so far
        gc.collect()
        text = metrics.render()
        assert 'breeze_gc_pause_seconds_count{generation="2"} 1.0' in text
    finally:
        gc.unfreeze()
        sys.setswitchinterval(interval)
        gc.callbacks[:] = callbacks
