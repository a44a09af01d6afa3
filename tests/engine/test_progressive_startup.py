"""A worker that serves before every batch shape is built (engine/batch_graphs.py, engine/startup.py), on the tiny
model in FP32 on the CPU with CUDA's bucketed shapes forced (`buckets=True`) and the units compiled by Dynamo
(aot_eager: its tracing and guards, no code generation):

- the stepper starts with the smallest shape only, uncompiled, and admits one stream; each later build (the
  starter's compiled build, then the shapes by the streams they serve) raises what it admits;
- a stream that runs while the other shapes are built, compiled and published gives exactly the frames the same
  request gives alone, and the compiled builds on a scratch step do not compile again when the engine steps the
  real views; the same builds run on the step's own buffers instead (what a start-up before any stream does)
  change the live stream's frames, which is what the scratch step prevents;
- through the real Engine, with the start-up thread held between pieces: admission never exceeds the built
  shapes (no request waits on a compile: the extra ones wait in the queue and join as capacity grows), every
  request gets its frames alone, and the engine reports how much of its capacity is ready.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from dataclasses import replace

import pytest
import torch
from engine_helpers import spy_frames_by_seed

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.batching import BatchedStepper
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import SynthesisRequest

COMPILED = FastPathSettings(compile="on", compile_backend="aot_eager")


@pytest.fixture(scope="module")
def model():
    from breeze_worker.model.tiny import tiny_model

    torch.set_num_threads(1)
    m = tiny_model(seed=0, with_codec=False)
    m.generation_defaults = replace(m.generation_defaults, max_sequence=256)  # one attention bucket
    return m


def _request(model, text: str, cfg: bool, seed: int, frames: int):
    req = SynthesisRequest(text=text, instruction="calm and slow" if cfg else None, cfg_scale=2.0 if cfg else None,
                           seed=seed, max_frames=frames)
    return resolve_request(req, model.generation_defaults, None, tokenizer=model.tokenizer)


def _alone(model, params) -> list[torch.Tensor]:
    return list(EagerFrameGenerator(model, params, "cpu"))


def test_the_starter_serves_one_stream_and_each_build_admits_more(model):
    stepper = BatchedStepper(model, 4, "cpu", buckets=True, settings=COMPILED, progressive=True)
    graphs = stepper.graphs
    assert graphs.shapes == [(1, 2), (2, 4), (4, 6), (4, 8)]
    assert graphs.ready_shapes == ((1, 2),) and not graphs.views[(1, 2)].compiled
    assert stepper.ready_streams == 1 and stepper.free_slots == 1
    # what is left, in the order it is useful: the starter compiled, then the shapes by the streams they serve
    assert graphs.pending() == [((1, 2), True), ((2, 4), True), ((4, 6), True), ((4, 8), True)]
    admitted = []
    while (shape := stepper.build_next()) is not None:
        admitted.append((shape, stepper.ready_streams))
    assert admitted == [((1, 2), 1), ((2, 4), 2), ((4, 6), 3), ((4, 8), 4)]
    assert all(view.compiled for view in graphs.views.values()) and graphs.complete
    assert stepper.stats()["compile_fallback"] is None


def test_a_live_stream_keeps_its_frames_alone_while_the_other_shapes_build(model):
    """Every build runs between two of the live stream's steps (the engine thread's and the start-up thread's
    work interleave at frame boundaries at best; here at each of them). The live stream uses CFG (rows 0 and 1,
    slot 0: inside every larger shape's prefix)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    live = _request(model, "hello there, a stream that starts alone", True, 11, 10)
    later = _request(model, "joins once two streams are ready", False, 12, 4)
    alone = {"live": _alone(model, live), "later": _alone(model, later)}
    stepper = BatchedStepper(model, 4, "cpu", buckets=True, settings=COMPILED, progressive=True)
    assert stepper.join([("live", live)]) == {}
    frames: dict[str, list] = {}
    builds = 0
    for _ in range(40):
        if len(stepper) == 0:
            break
        for key, out in stepper.step().items():
            assert out.error is None
            if out.frame is not None:
                frames.setdefault(key, []).append(out.frame)
        if stepper.build_next() is not None:
            builds += 1
            if builds == 2:  # (2, 4) published: a second stream may join now, and does
                assert stepper.ready_streams == 2
                assert stepper.join([("later", later)]) == {}
    assert builds == 4 and stepper.graphs.complete
    for key in ("live", "later"):
        assert len(frames[key]) == len(alone[key]) and all(torch.equal(a, b) for a, b in zip(frames[key], alone[key]))
    # the real views run what the scratch steps compiled: stepping them compiles nothing more
    unique = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert stepper.join([("again", live)]) == {}
        again = [out.frame for _ in range(10) for key, out in stepper.step().items() if out.frame is not None]
    assert counters["stats"]["unique_graphs"] == unique
    assert len(again) == len(alone["live"]) and all(torch.equal(a, b) for a, b in zip(again, alone["live"]))


def test_building_on_the_steps_own_buffers_while_a_stream_runs_would_change_its_frames(model):
    """The control: the same builds with their compiling warm-up on the step's own buffers (`exclusive`, as at
    start-up before any stream joins) while a stream runs change that stream's frames."""
    live = _request(model, "hello there, a stream that starts alone", True, 11, 8)
    stepper = BatchedStepper(model, 4, "cpu", buckets=True, settings=COMPILED, progressive=True)
    assert stepper.join([("live", live)]) == {}
    frames = []
    for _ in range(20):
        if len(stepper) == 0:
            break
        frames += [out.frame for out in stepper.step().values() if out.frame is not None]
        pending = stepper.graphs.pending()
        if pending:
            stepper.graphs.build(pending[0][0], compiled=True, exclusive=True)
    alone = _alone(model, live)
    assert len(frames) == len(alone) and not all(torch.equal(a, b) for a, b in zip(frames, alone))


# ---- through the Engine, with the start-up thread ----

@pytest.fixture
def gated_engine(tmp_path, monkeypatch):
    """An Engine on the CPU whose batched stepper has CUDA's bucketed shapes (uncompiled: the tiny model's
    attention buckets would make the compiles long) and whose start-up thread waits at `gate` before each
    piece."""
    from breeze_worker.artifacts.store import ArtifactStore
    from breeze_worker.config import ArtifactSettings, EngineSettings
    from breeze_worker.engine import batching, startup
    from breeze_worker.engine.service import Engine

    torch.set_num_threads(1)
    monkeypatch.setattr(batching, "BatchedStepper", functools.partial(BatchedStepper, buckets=True))
    gate = threading.Semaphore(0)
    piece = startup.StartupBuild._piece

    def gated(self, what, work):
        gate.acquire()
        piece(self, what, work)

    monkeypatch.setattr(startup.StartupBuild, "_piece", gated)
    settings = EngineSettings(device="cpu", fast_path="fast", max_active_streams=4, max_queue=8,
                              fastpath=FastPathSettings(compile="off"))
    engine = Engine(settings, ArtifactStore(ArtifactSettings(directory=tmp_path / "artifacts")))
    return engine, gate


def test_admission_never_exceeds_the_built_shapes_and_streams_get_their_frames_alone(gated_engine, monkeypatch):
    """Held at frame boundaries (the engine thread waits before each step for a permit; the start-up thread
    before each piece for one), so every stage is reached whatever the machine's speed: one stream runs while
    three more wait in the queue with one stream ready; two pieces later two are ready and exactly one more joins;
    once all is built the last two join."""
    from breeze_worker.engine.types import JobFinished, JobStarted, PcmEncoding

    engine, gate = gated_engine
    requests = [SynthesisRequest(text=f"request number {i} of the burst", seed=20 + i, max_frames=6 + i,
                                 instruction="calm" if i % 2 else None, cfg_scale=2.0 if i % 2 else None,
                                 encoding=PcmEncoding.F32LE) for i in range(4)]
    steps = threading.Semaphore(0)
    free_run = threading.Event()

    async def until(condition, what: str) -> None:
        for _ in range(6000):  # a condition the scenario reaches, waited for; the bound only ends a broken run
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"never reached: {what}")

    async def scenario():
        await engine.start()
        stepper = engine.scheduler._stepper
        assert engine.readiness()["ready_streams"] == 1 and engine.readiness()["configured_streams"] == 4
        recorded = spy_frames_by_seed(stepper, monkeypatch)
        joins: list = []
        join, step = stepper.join, stepper.step

        def checked_join(joiners):
            joins.append((len(stepper), len(joiners), stepper.ready_streams))
            return join(joiners)

        def held_step(**kwargs):
            if not free_run.is_set():
                steps.acquire()
            return step(**kwargs)

        monkeypatch.setattr(stepper, "join", checked_join)
        monkeypatch.setattr(stepper, "step", held_step)

        async def one(request, started=None):
            async for event in engine.synthesize(request):
                if isinstance(event, JobStarted) and started is not None:
                    started.set()
                if isinstance(event, JobFinished):
                    return event
            raise AssertionError("no JobFinished")

        started = asyncio.Event()
        tasks = [asyncio.create_task(one(requests[0], started))]
        await started.wait()
        tasks += [asyncio.create_task(one(r)) for r in requests[1:]]
        await until(lambda: engine.scheduler.load() == (1, 3), "one stream running, three queued")
        gate.release(2)  # the codec's 2-slot batch, then batch shape 2x4
        await until(lambda: stepper.ready_streams == 2, "two streams ready")
        steps.release()  # one step; the next pass admits one more stream (two ready), then waits
        await until(lambda: len(joins) == 2, "the second join")  # (the slot is held a moment before the join)
        assert engine.scheduler.load() == (2, 2)  # two streams running, two queued
        gate.release(100)
        await asyncio.to_thread(engine.runtime.startup.done.wait)
        free_run.set()
        steps.release(100)
        finished = await asyncio.gather(*tasks)
        doc = engine.readiness()
        await engine.stop()
        return finished, recorded, joins, doc, stepper

    finished, recorded, joins, doc, stepper = asyncio.run(scenario())
    assert joins == [(0, 1, 1), (1, 1, 2), (2, 2, 4)], joins  # (running, joining, ready) at each join
    assert not stepper._unbucketed  # every step ran a built shape
    assert [f.stats.frames for f in finished] == [r.max_frames for r in requests]
    assert doc["complete"] and doc["ready_streams"] == 4 and doc["batch_shapes"]["ready"] == 4
    assert doc["codec_batches"] == [1, 2, 4] and doc["building"] == "" and doc["failed"] is None
    for request in requests:
        params = resolve_request(request, engine.runtime.model.generation_defaults, None,
                                 tokenizer=engine.runtime.model.tokenizer)
        alone = _alone(engine.runtime.model, params)
        got = recorded[request.seed]
        assert len(got) == len(alone) and all(torch.equal(a, b) for a, b in zip(got, alone)), request.seed
