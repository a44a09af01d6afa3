"""Helpers shared by the engine tests."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf


def tone_wav(seconds: float) -> bytes:
    """A 220 Hz tone at 24 kHz as 16-bit WAV bytes: reference audio with sound in every frame (not speech)."""
    t = np.arange(round(seconds * 24000)) / 24000
    buffer = io.BytesIO()
    sf.write(buffer, (0.4 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000, format="WAV")
    return buffer.getvalue()


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
