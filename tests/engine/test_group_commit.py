"""Jobs that end at the same step commit their artifacts as one group (engine/scheduler.py,
artifacts/store.py `commit_together`): one commit's stall, not one per job, before their final messages.
Measured through the real `Engine` on the CPU, with each commit held back by the store's commit-delay fault
(a sleep at a commit's start, after its start is stamped), on one artifact-I/O thread. No time bound is
asserted: the structure (one start stamp for all) is what tells one group from four commits in a row."""

from __future__ import annotations

import asyncio

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
