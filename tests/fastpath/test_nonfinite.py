"""A frame computed from non-finite logits is never emitted: the request ends with NumericalError and the
event is counted."""

from __future__ import annotations

import pytest
import torch

from breeze_worker.engine.fastpath import generator as fast_generator
from breeze_worker.engine.fastpath.generator import FastFrameGenerator
from breeze_worker.engine.types import EndReason
from breeze_worker.errors import NumericalError


def test_forced_nonfinite_frame_is_not_emitted_and_counted(model, request_for, steer_logits):
    steer_logits.nan_depth(model.lm)  # NaN in codebook 5's logits of the third frame
    before = fast_generator.nonfinite_events()
    gen = FastFrameGenerator(model, request_for(model, False, frames=6), "cpu")
    emitted = []
    with pytest.raises(NumericalError, match="non-finite"):
        for frame in gen:
            emitted.append(frame)
    assert len(emitted) == 2  # frames 0 and 1; frame 2 was discarded
    assert all(bool((f >= 0).all()) and bool((f < 2048).all()) for f in emitted)
    assert gen.nonfinite_events == 1
    assert fast_generator.nonfinite_events() == before + 1
    assert gen.end_reason == EndReason.ERROR


def test_clean_run_counts_nothing(model, request_for):
    before = fast_generator.nonfinite_events()
    frames = list(FastFrameGenerator(model, request_for(model, True, frames=3), "cpu"))
    assert len(frames) == 3
    assert fast_generator.nonfinite_events() == before
    assert all(torch.isfinite(f.float()).all() for f in frames)


def test_masked_end_of_speech_is_not_mistaken_for_a_nonfinite_frame(model, request_for):
    """The bench's end-of-speech mask is a deliberate "never", not a numerical failure."""
    before = fast_generator.nonfinite_events()
    gen = FastFrameGenerator(model, request_for(model, True, frames=8), "cpu", eos_masked=True)
    frames = list(gen)
    assert len(frames) == 8 and gen.end_reason == EndReason.FRAME_LIMIT
    assert gen.nonfinite_events == 0 and fast_generator.nonfinite_events() == before


def test_a_nonfinite_request_does_not_poison_the_next_one_on_its_runner(model, request_for, nan_frame_embedding):
    """A request whose backbone step computed NaN (here: its frame embedding, at the second backbone step)
    left NaN keys/values in the pooled runner's caches. Masked slots are added to -inf-like scores, and NaN
    stays NaN, so the next request on that runner failed too. The runner's caches are scrubbed when such a
    request ends: the next request gives the eager reference's frames."""
    from breeze_worker.engine.eager import EagerFrameGenerator
    from breeze_worker.engine.fastpath.graph import clear_runners

    clear_runners()
    with nan_frame_embedding(model.lm, at=2) as calls, pytest.raises(NumericalError, match="non-finite"):
        list(FastFrameGenerator(model, request_for(model, True, frames=6), "cpu"))
    request = request_for(model, True, frames=4, seed=11)
    eager = list(EagerFrameGenerator(model, request, "cpu"))
    fast = list(FastFrameGenerator(model, request, "cpu"))  # the same pooled runner
    clear_runners()
    assert calls["n"] >= 2 and len(fast) == len(eager) == 4
    assert all(torch.equal(a, b) for a, b in zip(eager, fast))
