"""FastFrameGenerator with one frame in flight (FastPathSettings.pipeline, BREEZE_FASTPATH_PIPELINE=on): the
same frames as the eager reference and as the unpipelined loop, one host read per frame, the frame limit and
end of speech honoured although the next frame was already queued, and a non-finite frame never emitted (CPU,
FP32, tiny model)."""

from __future__ import annotations

import pytest
import torch

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.fastpath.generator import FastFrameGenerator
from breeze_worker.engine.fastpath.graph import clear_runners
from breeze_worker.engine.fastpath.step import FrameStep
from breeze_worker.engine.types import EndReason
from breeze_worker.errors import NumericalError


@pytest.mark.parametrize("cfg", [False, True])
def test_pipelined_frames_equal_eager_and_unpipelined(model, request_for, cfg):
    request = request_for(model, cfg, frames=5)
    eager = list(EagerFrameGenerator(model, request, "cpu"))
    runs = {}
    for mode in ("off", "on"):
        clear_runners()
        gen = FastFrameGenerator(model, request, "cpu", settings=FastPathSettings(pipeline=mode == "on"))
        runs[mode] = list(gen)
        assert gen.end_reason is EndReason.FRAME_LIMIT and gen.host_reads == 5 == gen.frames_emitted
    clear_runners()
    assert len(runs["on"]) == 5
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(eager, runs["off"], runs["on"]))


@pytest.mark.parametrize("mode", ["off", "on"])
def test_pipelined_end_of_speech_stops_with_the_next_frame_in_flight(model, request_for, monkeypatch, mode,
                                                                     steer_logits):
    sampled = {"n": 0}
    original_sample = FrameStep.sample_frame

    def counted(self):
        sampled["n"] += 1
        return original_sample(self)

    monkeypatch.setattr(FrameStep, "sample_frame", counted)
    # the third backbone read-out (after the prefill's and one step's) ends the stream at frame 2
    calls = steer_logits.end_of_speech(model, at=3)
    clear_runners()
    gen = FastFrameGenerator(model, request_for(model, False, frames=50), "cpu",
                             settings=FastPathSettings(pipeline=mode == "on"))
    out = list(gen)
    clear_runners()
    assert len(out) == 2 and gen.end_reason is EndReason.END_OF_SPEECH
    assert calls["n"] == 4  # frame 3's backbone step was queued before frame 2 was read, and thrown away
    # pipelined, frame 3 was sampled too (in flight while frame 2 was read); unpipelined it was not
    assert sampled["n"] == (4 if mode == "on" else 3)


def test_pipelined_nonfinite_frame_is_not_emitted(model, request_for, monkeypatch, steer_logits):
    steer_logits.nan_depth(model.lm)  # NaN in codebook 5's logits of the third frame
    clear_runners()
    gen = FastFrameGenerator(model, request_for(model, False, frames=6), "cpu",
                             settings=FastPathSettings(pipeline=True))
    emitted = []
    with pytest.raises(NumericalError, match="non-finite"):
        for frame in gen:
            emitted.append(frame)
    clear_runners()
    assert len(emitted) == 2 and gen.nonfinite_events == 1 and gen.end_reason is EndReason.ERROR
