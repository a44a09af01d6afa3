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


def run_schedule(stepper, schedule: dict[int, list], max_steps: int = 50):
    """Step a batched stepper until every stream ended; `schedule` {step index: [(key, request), ...]} joins at
    frame boundaries. Returns (frames per key, end reason per key, the rows each stream held at each step)."""
    frames: dict = {}
    ends: dict = {}
    layouts: list[dict] = []
    for n in range(max_steps):
        if n in schedule:
            assert stepper.join(schedule[n]) == {}
        if not len(stepper) and n > max(schedule):
            break
        layouts.append({key: list(st.rows) for key, st in stepper._streams.items()})
        for key, out in stepper.step().items():
            assert out.error is None
            if out.frame is not None:
                frames.setdefault(key, []).append(out.frame)
            if out.end_reason is not None:
                ends[key] = out.end_reason
    return frames, ends, layouts
