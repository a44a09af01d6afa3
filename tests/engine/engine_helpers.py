"""Helpers shared by the engine tests."""

from __future__ import annotations


def spy_frames_by_seed(stepper, monkeypatch) -> dict[int, list]:
    """Record the frames `stepper` hands the scheduler, per request seed (the engine itself emits only PCM)."""
    recorded: dict[int, list] = {}
    step = stepper.step

    def spy(**kwargs):
        outcomes = step(**kwargs)
        for job, out in outcomes.items():
            if out.frame is not None:
                recorded.setdefault(job.params.seed, []).append(out.frame)
        return outcomes

    monkeypatch.setattr(stepper, "step", spy)
    return recorded
