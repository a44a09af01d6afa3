"""Recovery of a non-finite frame on the GPU, through the batched engine's CUDA graphs (engine/batching.py,
engine/fastpath/recovery.py). Mid-size model (full widths, 4 backbone and 3 depth layers), seeded random weights:

- fp16-mixed with massive activations in the first MLP of the backbone and of the depth decoder, which the
  start-up probe did not see (applied after the policy): every frame of 4 streams (2 with CFG) overflows FP16 in
  the graphs, is recomputed at the safe precision and emitted; no stream fails, the layer is named, and the
  frames agree with the eager reference run entirely at the safe precision (the same FP16 weights, every
  half-precision layer in FP32, the backbone cache rounded to FP16 as the engine's is): a floor, since the two
  attend over their caches through different kernels (padded prompts against each row's own slots);
- FP32, one stream's pending logits poisoned with NaN between two graph replays: that stream recovers, and the
  stream beside it in the same steps gives exactly the frames of a run without the poison.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from gpu_support import release_device_memory

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.batching import BatchedStepper
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.precision import make_policy, widened
from breeze_worker.measure.models import random_model
from breeze_worker.measure.runner import make_request, mask_end_of_speech
from breeze_worker.model.lm.layers import RoundingKVCache

pytestmark = pytest.mark.gpu

STRESS = 1500.0
FRAMES = 6
CAPACITY = 256
UNCOMPILED = FastPathSettings(compile="off")  # CUDA graphs, no compile: a short start


def _model(cuda, policy: str, stressed: bool):
    model = random_model("mid", 1234, cuda, make_policy(policy, "GPU suite"), with_codec=False)
    model.generation_defaults = replace(model.generation_defaults, max_sequence=CAPACITY)
    mask_end_of_speech(model)
    if stressed:
        with torch.no_grad():
            for mlp in (model.lm.backbone_model.layers[0].mlp, model.lm.depth_decoder.model.layers[0].mlp):
                mlp.gate_proj.weight.mul_(STRESS)
                mlp.up_proj.weight.mul_(STRESS)
    return model


def _run(stepper, joins, steps: int, between=None):
    assert stepper.join(joins) == {}
    frames, errors = {}, {}
    for index in range(steps):
        if not len(stepper):
            break
        for key, out in stepper.step().items():
            if out.error is not None:
                errors[key] = out.error
            if out.frame is not None:
                frames.setdefault(key, []).append(out.frame)
        if between is not None:
            between(stepper, index)
    return frames, errors


@pytest.mark.timeout(900)
def test_fp16_overflows_recover_inside_the_batched_graphs(cuda, write_figures):
    model = _model(cuda, "fp16-mixed", stressed=True)
    requests = {f"s{i}": make_request(model, i % 2 == 0, FRAMES, 40 + i) for i in range(4)}
    stepper = BatchedStepper(model, 4, cuda, eos_masked=True, settings=UNCOMPILED)
    assert stepper.stats()["graphs"] > 0, stepper.stats()["graph_fallback"]
    half_kv = stepper.step_buffers.cache.key.dtype == torch.float16
    frames, errors = _run(stepper, list(requests.items()), FRAMES + 2)
    assert errors == {}
    for key in requests:
        info = stepper.stream_info(key)
        assert len(frames[key]) == FRAMES and info["nonfinite_events"] == info["nonfinite_recovered"] == FRAMES
    assert {stepper.stream_info(key)["nonfinite_layer"] for key in requests} == {
        "backbone_model.layers.0.mlp.down_proj"}
    layers = model.config.backbone.num_hidden_layers
    if half_kv:
        model.lm.new_backbone_cache = lambda: RoundingKVCache(layers, torch.float16)
    with widened(model.lm):
        reference = {key: list(EagerFrameGenerator(model, req, cuda)) for key, req in requests.items()}
    pairs = [(a, b) for key in requests for a, b in zip(frames[key], reference[key])]
    identical = sum(bool(torch.equal(a.cpu(), b.cpu())) for a, b in pairs) / len(pairs)
    write_figures("recovery_fp16_overflow", {"model": "random-mid", "streams": 4, "frames": FRAMES,
                                             "backbone_kv_fp16": half_kv, "identical_to_safe_reference": identical})
    assert identical >= 0.75, identical
    del stepper, model
    release_device_memory()


@pytest.mark.timeout(900)
def test_a_poisoned_stream_recovers_and_its_neighbour_is_untouched(cuda):
    model = _model(cuda, "fp32", stressed=False)
    requests = {"x": make_request(model, True, FRAMES, 7), "y": make_request(model, False, FRAMES, 8)}
    clean, errors = _run(BatchedStepper(model, 2, cuda, eos_masked=True, settings=UNCOMPILED),
                         list(requests.items()), FRAMES + 2)
    assert errors == {}
    stepper = BatchedStepper(model, 2, cuda, eos_masked=True, settings=UNCOMPILED)

    def poison(stepper, index):
        if index == 2:  # the pending logits of x's fourth frame, written by the graph of the step before
            stepper.step_buffers.logits[stepper._streams["x"].rows] = float("nan")

    frames, errors = _run(stepper, list(requests.items()), FRAMES + 2, between=poison)
    assert errors == {} and stepper.stream_info("x")["nonfinite_events"] == 1
    assert stepper.stream_info("y")["nonfinite_events"] == 0
    assert all(torch.equal(a, b) for a, b in zip(frames["y"], clean["y"])) and len(frames["y"]) == FRAMES
    assert all(torch.equal(a, b) for a, b in zip(frames["x"][:3], clean["x"][:3])) and len(frames["x"]) == FRAMES
    del stepper, model
    release_device_memory()
