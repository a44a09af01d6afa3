"""The fast code path (static caches, packed layers, graph-safe sampler; no graph on the CPU) reproduces the
eager reference's frames exactly in FP32 for the same seed, with and without CFG."""

from __future__ import annotations

import pytest
import torch

from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.fastpath.generator import FastFrameGenerator
from breeze_worker.engine.sampling import exponential_noise, frame_noise
from breeze_worker.engine.types import EndReason


@pytest.mark.parametrize("cfg", [False, True])
def test_fast_frames_equal_eager(model, cfg, request_for):
    request = request_for(model, cfg)
    assert request.uses_cfg == cfg
    eager = list(EagerFrameGenerator(model, request, "cpu"))
    fast_gen = FastFrameGenerator(model, request, "cpu")
    fast = list(fast_gen)
    assert len(eager) == len(fast) == 6
    for e, f in zip(eager, fast):
        assert f.dtype == torch.int64 and f.shape == (16,)
        assert torch.equal(e, f)
    assert fast_gen.end_reason == EndReason.FRAME_LIMIT
    assert fast_gen.host_reads == len(fast)  # one host read per frame


def test_different_seed_changes_frames(model, request_for):
    a = list(FastFrameGenerator(model, request_for(model, False, seed=1), "cpu"))
    b = list(FastFrameGenerator(model, request_for(model, False, seed=2), "cpu"))
    assert not all(torch.equal(x, y) for x, y in zip(a, b))


def test_batched_frame_noise_is_bit_identical():
    seed, frame = torch.tensor([3, 2**40 + 11]), torch.tensor([0, 57])
    batched = frame_noise(seed, frame, 16, 2052)
    for codebook in range(16):
        assert torch.equal(batched[:, codebook], exponential_noise(seed, frame, codebook, 2052))
