"""Voice direction with two guidance scales (three rows a stream) on the GPU, FP32, end of speech masked:
- batch 1: the fast path with graphs, uncompiled, gives the eager generator's frames exactly; as served
  (compiled, graphs, the sampling kernel; three rows run the library-GEMM form) it is recorded against them and
  must run with graphs and compiled;
- the batched engine (graphs on, uncompiled): 8 streams, two with two guidance scales, two with CFG and four
  plain (14 rows), stepped together give each stream's frames alone exactly, with the joiners' prompts prefilled
  together and one by one.
The checks' logic runs on the CPU on the tiny model too (the test without the `gpu` mark), so that a bug in a
check shows before device time is spent."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from gpu_support import release_device_memory

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.fastpath.generator import FastFrameGenerator
from breeze_worker.engine.precision import make_policy
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import ReferenceInput, ResolvedReference, SynthesisRequest
from breeze_worker.measure.models import random_model
from breeze_worker.measure.runner import mask_end_of_speech

FRAMES = 12
CAPACITY = 256


def _model(size: str, device: torch.device):
    model = random_model(size, 1234, device, make_policy("fp32", "GPU suite"), with_codec=False)
    model.generation_defaults = replace(model.generation_defaults, max_sequence=CAPACITY)
    mask_end_of_speech(model)
    return model


def _request(model, kind: str, seed: int, frames: int = FRAMES):
    """kind: dual (three rows), cfg (two) or plain (one)."""
    reference = None
    fields: dict = {}
    if kind == "dual":
        codes = np.random.RandomState(seed).randint(0, 2048, (20, 16))
        reference = ResolvedReference(f"ref-{seed}", "a reference line", codes, 1.6)
        fields = dict(instruction="Speak clearly and naturally.", cfg_scale_reference=1.5, cfg_scale_instruction=2.0,
                      reference=ReferenceInput(reference_id=reference.reference_id))
    elif kind == "cfg":
        fields = dict(instruction="Speak clearly and naturally.", cfg_scale=2.0)
    req = SynthesisRequest(text="The quick brown fox jumps over the lazy dog.", seed=seed, max_frames=frames,
                           **fields)
    return resolve_request(req, model.generation_defaults, reference, tokenizer=model.tokenizer)


def batch1_against_eager(model, device, settings: FastPathSettings) -> dict:
    request = _request(model, "dual", 7)
    eager = list(EagerFrameGenerator(model, request, device))
    generator = FastFrameGenerator(model, request, device, settings=settings)
    fast = list(generator)
    same = [torch.equal(a, b) for a, b in zip(eager, fast)]
    return {"frames": len(fast), "eager_frames": len(eager), "identical_fraction": sum(same) / max(len(eager), 1),
            "first_differing_frame": next((i for i, s in enumerate(same) if not s), None),
            "graphs": bool(generator.graphs), "compiled": bool(generator.compiled),
            "fallback": generator.fallback_reason or generator.compile_fallback_reason}


def batched_against_alone(model, device, settings: FastPathSettings) -> dict:
    from breeze_worker.engine.batching import BatchedStepper
    from breeze_worker.measure.concurrency import alone_frames, run_burst

    kinds = ["dual", "plain", "cfg", "plain", "dual", "plain", "cfg", "plain"]
    requests = [_request(model, kind, 99 + i, 16) for i, kind in enumerate(kinds)]
    stepper = BatchedStepper(model, 8, device, eos_masked=True, settings=settings)
    alone = alone_frames(stepper, requests, device)
    out = {"rows": sum(q.branches for q in requests), "kinds": kinds}
    for mode in ("batched", "per-stream"):
        stepper.batch_joins = mode == "batched"
        together = run_burst(stepper, None, requests, device)["frames"]
        same = [[torch.equal(a, b) for a, b in zip(alone[k], together[k])] for k in range(len(requests))]
        out[mode] = {"identical_fraction": sum(map(sum, same)) / (16 * len(requests)),
                     "frames": [len(together[k]) for k in range(8)],
                     # which stream parts from its frames alone, and where: a row-count-dependent GEMM shows
                     # as the multi-row streams parting, a slot or mask fault as any stream at its join
                     "first_differing_frame": [next((i for i, s in enumerate(row) if not s), None) for row in same]}
    return out


def test_the_checks_hold_on_the_cpu():
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    model = _model("tiny", cpu)
    alone = batch1_against_eager(model, cpu, FastPathSettings(compile="off"))
    assert alone["identical_fraction"] == 1.0 and alone["frames"] == FRAMES
    batched = batched_against_alone(model, cpu, FastPathSettings(compile="off"))
    assert batched["rows"] == 14
    for mode in ("batched", "per-stream"):
        assert batched[mode]["identical_fraction"] == 1.0 and batched[mode]["frames"] == [16] * 8


@pytest.fixture(scope="module")
def mid_model(cuda):
    model = _model("mid", cuda)
    yield model
    del model
    release_device_memory()


@pytest.mark.gpu
def test_batch1_with_two_guidance_scales_equals_eager(mid_model, cuda, write_figures):
    uncompiled = batch1_against_eager(mid_model, cuda, FastPathSettings(compile="off"))
    served = batch1_against_eager(mid_model, cuda, FastPathSettings())
    write_figures("dual_guidance_batch1_fp32", {"model": "random-mid", "uncompiled": uncompiled, "served": served})
    assert uncompiled["graphs"] and uncompiled["identical_fraction"] == 1.0, uncompiled
    assert served["graphs"] and served["compiled"] and served["frames"] == FRAMES, served


@pytest.mark.gpu
def test_batched_streams_with_two_guidance_scales_equal_each_stream_alone(mid_model, cuda, write_figures):
    result = batched_against_alone(mid_model, cuda, FastPathSettings(compile="off"))
    write_figures("dual_guidance_batched_fp32", {"model": "random-mid", **result})
    for mode in ("batched", "per-stream"):
        assert result[mode]["identical_fraction"] == 1.0, (mode, result)
