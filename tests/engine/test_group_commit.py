"""Jobs that end at the same step commit their artifacts as one group (engine/scheduler.py,
artifacts/store.py `commit_together`): one commit's stall, not one per job, before their final messages.
Measured through the real `Engine` on the CPU, with each commit held back by the store's commit-delay fault
(a sleep at a commit's start, after its start is stamped), on one artifact-I/O thread. No time bound is
asserted: the structure (one start stamp for all) is what tells one group from four commits in a row."""

from __future__ import annotations

import asyncio
import threading

import torch

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ArtifactSettings, EngineSettings
from breeze_worker.engine.service import Engine
from breeze_worker.engine.types import JobFinished, SynthesisRequest

DELAY_S = 0.4


def test_jobs_ending_at_one_step_commit_together(tmp_path):
    torch.set_num_threads(1)
    settings = EngineSettings(device="cpu", max_active_streams=4, max_queue=4, join_gather_ms=20_000,
                              join_gather_quiet_ms=1_000, artifact_commit_threads=1)
    store = ArtifactStore(ArtifactSettings(directory=tmp_path / "artifacts", fault_commit_delay_s=DELAY_S))
    engine = Engine(settings, store)

    async def one(seed):
        request = SynthesisRequest(text="one two three", seed=seed, max_frames=2)
        return [event async for event in engine.synthesize(request)]

    async def main():
        await engine.start()
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(seed) for seed in range(4))), 60)
        finally:
            await engine.stop()

    finals = [events[-1] for events in asyncio.run(main())]
    assert all(isinstance(f, JobFinished) and f.artifact is not None for f in finals)
    # one group: one start stamp (one stall); one at a time on the one thread they would be DELAY_S apart
    assert len({f.artifact.commit.started_at_ns for f in finals}) == 1
    assert all(f.artifact.committed_at_ns - f.artifact.commit.started_at_ns >= DELAY_S * 1e9 for f in finals)
    for f in finals:  # each is whole on disk and described by its sidecar
        record = store.describe(f.artifact.artifact_id)
        assert record["sha256"] == f.artifact.sha256 and record["size_bytes"] == f.artifact.size_bytes
        assert store.wav_path(f.artifact.artifact_id).stat().st_size == f.artifact.size_bytes


def test_a_groups_final_events_reach_the_event_loop_in_one_wake_up(tmp_path):
    """Every job of the group gets its final event and its end from the committing thread in one hand-over
    (session.post): one write to the loop's wake-up pipe, not two a job."""
    torch.set_num_threads(1)
    settings = EngineSettings(device="cpu", max_active_streams=4, max_queue=4, join_gather_ms=20_000,
                              join_gather_quiet_ms=1_000, artifact_commit_threads=1)
    engine = Engine(settings, ArtifactStore(ArtifactSettings(directory=tmp_path / "artifacts")))

    async def main():
        await engine.start()
        loop = asyncio.get_running_loop()
        handed: list[list] = []  # the items of each wake-up from the committing thread
        original = loop.call_soon_threadsafe

        def counted(callback, *args, **kwargs):
            if threading.current_thread().name.startswith("artifact-io"):
                handed.append([item for _, item in args[0]])
            return original(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counted

        async def one(seed):
            return [event async for event in engine.synthesize(SynthesisRequest(text="one two", seed=seed,
                                                                                max_frames=2))]
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(seed) for seed in range(4))), 60), handed
        finally:
            await engine.stop()

    streams, handed = asyncio.run(main())
    assert all(isinstance(events[-1], JobFinished) and events[-1].artifact is not None for events in streams)
    assert len(handed) == 1 and len(handed[0]) == 8  # four final events and four ends
    assert [type(item).__name__ for item in handed[0][::2]] == ["JobFinished"] * 4
    assert {id(events[-1]) for events in streams} == {id(item) for item in handed[0][::2]}
