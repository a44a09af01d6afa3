"""Jobs that finish at the same step commit their artifacts side by side, on `artifact_commit_threads`
threads (engine/scheduler.py): each job's final message waits for its own commit, so with one thread the
last of a step's jobs would wait for every commit before its own. Measured through the real `Engine` on the
CPU, with each commit held back by the store's commit-delay fault (a sleep at the commit's start, after its
start is stamped)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ArtifactSettings, EngineSettings
from breeze_worker.engine.service import Engine
from breeze_worker.engine.types import JobFinished, SynthesisRequest

DELAY_S = 0.4


def _commit_starts(tmp_path, threads: int) -> list[float]:
    """Seconds from the first commit's start to each commit's start, for four jobs that join together and
    end at the same step."""
    torch.set_num_threads(1)
    settings = EngineSettings(device="cpu", max_active_streams=4, max_queue=4, join_gather_ms=20_000,
                              join_gather_quiet_ms=1_000, artifact_commit_threads=threads)
    store = ArtifactStore(ArtifactSettings(directory=tmp_path / f"artifacts-{threads}",
                                           fault_commit_delay_s=DELAY_S))
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
    done = [f.done_at_ns for f in finals]  # one join, one last step: their commits were queued together
    assert (max(done) - min(done)) / 1e9 < DELAY_S / 4
    starts = sorted(f.artifact.commit.started_at_ns for f in finals)
    return [(t - starts[0]) / 1e9 for t in starts]


@pytest.mark.parametrize("threads", [1, 4])
def test_a_steps_commits_run_on_the_configured_threads(tmp_path, threads):
    starts = _commit_starts(tmp_path, threads)
    if threads == 4:  # all four at once: none waited for another's commit
        assert starts[-1] < DELAY_S / 2
    else:  # one after another: each waited for the one before
        assert all(b - a >= DELAY_S * 0.9 for a, b in zip(starts, starts[1:]))
