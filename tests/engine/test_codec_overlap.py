"""The codec overlap (engine/scheduler.py, engine/codec_rows.py) through the real `Engine` on the CPU: a step's
codec call is launched after its frames are read and its audio is read while the next step runs, with the codec
on its own stream (overlap) or not; the audio and the frame counts are what the engine without overlap gives."""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import pytest
import torch
from engine_helpers import spy_frames_by_seed

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ArtifactSettings, EngineSettings
from breeze_worker.engine.codec_rows import CodecRows
from breeze_worker.engine.service import Engine
from breeze_worker.engine.types import AudioChunk, JobFinished, PcmEncoding, SynthesisRequest


def _engine(tmp_path, overlap: str) -> Engine:
    torch.set_num_threads(1)
    settings = EngineSettings(device="cpu", fast_path="fast", max_active_streams=2, max_queue=2,
                              codec_overlap=overlap == "on")
    engine = Engine(settings, ArtifactStore(ArtifactSettings(directory=tmp_path / overlap)))
    asyncio.run(engine.start())
    return engine


def _trace(engine) -> list[str]:
    """Record, in order: each stepper call's start and end, each codec launch and each wait for its audio."""
    scheduler, events = engine.scheduler, []
    step, launch = scheduler._stepper.step, scheduler._codec.launch

    def traced_step(**kwargs):
        events.append("step")
        out = step(**kwargs)
        events.append("stepped")
        return out

    def traced_launch(frames, **kwargs):
        pending = launch(frames, **kwargs)
        n = events.count("launch") + 1
        events.append("launch")
        wait = pending.wait_rows

        def traced_wait():
            events.append(f"wait{n}")
            return wait()

        pending.wait_rows = traced_wait
        return pending

    scheduler._stepper.step, scheduler._codec.launch = traced_step, traced_launch
    return events


async def _run(engine, requests) -> list[tuple[bytes, JobFinished]]:
    async def one(request):
        pcm, finished = b"", None
        async for event in engine.synthesize(request):
            if isinstance(event, AudioChunk):
                pcm += event.pcm
            elif isinstance(event, JobFinished):
                finished = event
        return pcm, finished
    return await asyncio.gather(*(one(r) for r in requests))


def _requests() -> list[SynthesisRequest]:
    return [SynthesisRequest(text="overlap one", seed=3, max_frames=3, encoding=PcmEncoding.F32LE),
            SynthesisRequest(text="and a second, longer", instruction="calm", cfg_scale=2.0, seed=4, max_frames=5,
                             encoding=PcmEncoding.F32LE)]


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_audio_is_read_during_the_next_step(tmp_path, overlap):
    engine = _engine(tmp_path, overlap)
    try:
        assert engine.scheduler.overlap is (overlap == "on")
        events = _trace(engine)
        [(pcm, finished)] = asyncio.run(_run(engine, _requests()[:1]))
    finally:
        asyncio.run(engine.stop())
    assert finished.stats.frames == 3 and len(pcm) == 3 * 1920 * 4
    # with the codec on its own stream or not: wait k runs inside step k+1 (the host's delivery work overlaps
    # the device's next step); the last step's audio is read at once (no step follows)
    assert events == ["step", "stepped", "launch", "step", "wait1", "stepped", "launch",
                      "step", "wait2", "stepped", "launch", "wait3"]


def test_overlap_changes_no_sample(tmp_path, monkeypatch):
    """One stream alone: the same bytes with and without overlap. Two streams of different lengths (one ends
    while the other goes on): the same frames, and the same audio up to the CPU's batch-width rounding
    (whether they join at one step or two depends on timing, and with it the codec batch's width)."""
    results, frames = {}, {}
    for overlap in ("on", "off"):
        engine = _engine(tmp_path, overlap)
        try:
            frames[overlap] = spy_frames_by_seed(engine.scheduler._stepper, monkeypatch)
            results[overlap] = asyncio.run(_run(engine, _requests()[1:])), asyncio.run(_run(engine, _requests()))
        finally:
            asyncio.run(engine.stop())
    (alone_on, _), (alone_off, _) = results["on"][0][0], results["off"][0][0]
    assert len(alone_on) == 5 * 1920 * 4 and alone_on == alone_off
    for (pcm_on, fin_on), (pcm_off, fin_off), request in zip(results["on"][1], results["off"][1], _requests()):
        assert fin_on.stats.frames == fin_off.stats.frames == request.max_frames
        a, b = np.frombuffer(pcm_on, "<f4"), np.frombuffer(pcm_off, "<f4")
        assert a.shape == b.shape == (request.max_frames * 1920,) and np.abs(a - b).max() < 1e-4
    for seed in (3, 4):
        got, want = frames["on"][seed], frames["off"][seed]
        assert len(got) == len(want) and all(torch.equal(x, y) for x, y in zip(got, want))


def test_overlap_setting():
    from breeze_worker.commands.serve import add_arguments, settings_from_args
    from breeze_worker.model.codec import tiny_codec

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert settings_from_args(parser.parse_args([]), {}).engine.codec_overlap is False  # serial by default
    assert settings_from_args(parser.parse_args(["--codec-overlap"]), {}).engine.codec_overlap is True
    assert settings_from_args(parser.parse_args([]), {"BREEZE_ENGINE_CODEC_OVERLAP": "1"}).engine.codec_overlap
    assert not settings_from_args(parser.parse_args(["--no-codec-overlap"]),
                                  {"BREEZE_ENGINE_CODEC_OVERLAP": "1"}).engine.codec_overlap
    assert CodecRows(tiny_codec(seed=0), overlap=True).stream is None  # no CUDA stream on the CPU


class _BehindTheLanguageModel:
    """A launched codec step as CUDA queues it when serial: behind the next frame's backbone step on one
    stream. Its wait takes 30 ms more (that step); its own device time is 1 ms."""

    queued_on_device = True

    def __init__(self, pending):
        self._pending = pending

    def device_ms(self) -> float:
        return 1.0

    def wait_rows(self):  # what the scheduler reads (wait() is built on it)
        time.sleep(0.03)
        return self._pending.wait_rows()

    def __getattr__(self, name):
        return getattr(self._pending, name)


def test_stage_split_books_the_queued_backbone_step_to_generation(tmp_path):
    """Serial on CUDA the codec's wait also sits through the next frame's backbone step: the job's codec
    stage is the codec steps' own device time, and the rest of the wait goes to generation."""
    engine = _engine(tmp_path, "off")
    launch = engine.scheduler._codec.launch
    engine.scheduler._codec.launch = lambda frames, **kwargs: _BehindTheLanguageModel(launch(frames, **kwargs))
    try:
        [(pcm, finished)] = asyncio.run(_run(engine, _requests()[:1]))
    finally:
        asyncio.run(engine.stop())
    stages = finished.stats.stages
    assert finished.stats.frames == 3 and len(pcm) == 3 * 1920 * 4
    assert stages.codec_s <= 3 * 0.001 + 1e-9  # three steps' own time
    assert stages.generate_s >= 3 * 0.03  # the waits' remainder
