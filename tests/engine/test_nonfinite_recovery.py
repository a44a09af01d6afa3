"""A frame whose values go non-finite is recomputed at a safe precision and the stream goes on
(engine/fastpath/recovery.py through engine/batching.py), on the tiny model on the CPU:

- the massive-activation stress (measure/agreement.py's: the first backbone MLP's gate and up projections
  scaled, so the down projection's input passes FP16's 65,504) under fp16-mixed, with the start-up probe's
  keep-in-FP32 list empty as if the probe's prompt had not shown it: every frame the stepper emits equals the
  eager reference (engine/eager.py) run entirely at the safe precision, the layer that overflowed is named;
- only the stream whose rows went bad is recomputed: a stream beside it in the same steps gives its frames
  alone, and so does the recovered one (FP32: the recomputation is the reference arithmetic);
- frame 0 (the prompt's prefill) is recovered as well;
- a frame that is not finite at the safe precision either ends its stream alone, with an error that does not
  invite a retry, and leaves clean rows for the next stream;
- through the real Engine: the job's stats (and their protobuf form) carry the count and the layer, and
  breeze_nonfinite_events_total counts it as recovered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
import torch

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.batching import BatchedStepper
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.precision import apply_policy, make_policy, widened
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import EndReason, SynthesisRequest
from breeze_worker.errors import NumericalError
from breeze_worker.model.lm.layers import RoundingKVCache
from breeze_worker.model.tiny import tiny_model

STRESS = 1500.0  # the massive-activation scale of tests/fastpath/test_precision.py: ~1e5 inside the first MLP
OVERFLOWING = "backbone_model.layers.0.mlp.down_proj"


def _request(model, text: str, cfg: bool, seed: int, frames: int):
    req = SynthesisRequest(text=text, instruction="calm and slow" if cfg else None, cfg_scale=2.0 if cfg else None,
                           seed=seed, max_frames=frames)
    return resolve_request(req, model.generation_defaults, None, tokenizer=model.tokenizer)


@pytest.fixture(scope="module")
def fp32_model():
    torch.set_num_threads(1)
    return tiny_model(seed=0, with_codec=False)


@pytest.fixture(scope="module")
def stressed_model():
    """fp16-mixed (forced on the CPU) with massive activations its start-up probe did not see: in the first MLP
    of the backbone and of the depth decoder, so that every frame overflows (each frame is then entirely the safe
    precision's, and the stream's output can be compared with that precision's reference as a whole)."""
    torch.set_num_threads(1)
    model = tiny_model(seed=0, with_codec=False)
    with torch.no_grad():
        for mlp in (model.lm.backbone_model.layers[0].mlp, model.lm.depth_decoder.model.layers[0].mlp):
            mlp.gate_proj.weight.mul_(STRESS)
            mlp.up_proj.weight.mul_(STRESS)
    apply_policy(model.lm, make_policy("fp16-mixed", "test: forced on the CPU"), keep_fp32=())
    return model


def _run(stepper, joins: list, steps: int = 30):
    """Step until every stream ended: frames, end reasons and errors per key."""
    assert stepper.join(joins) == {}
    frames: dict[str, list] = {}
    ends, errors = {}, {}
    for _ in range(steps):
        if not len(stepper):
            break
        for key, out in stepper.step().items():
            if out.error is not None:
                errors[key] = out.error
            if out.frame is not None:
                frames.setdefault(key, []).append(out.frame)
            if out.end_reason is not None:
                ends[key] = out.end_reason
    return frames, ends, errors


def _equal(got: list, want: list) -> bool:
    return len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("half_kv", [False, True], ids=["fp32-cache", "fp16-cache"])
def test_an_fp16_overflow_is_recomputed_at_the_safe_precision_and_the_streams_go_on(stressed_model, caplog,
                                                                                  monkeypatch, half_kv):
    model = stressed_model
    requests = {"cfg": _request(model, "hello there", True, 1, 6), "plain": _request(model, "short one", False, 2, 5)}
    # without recovery: the served precision's own reference turns the overflow into NaN logits
    from breeze_worker.measure.agreement import first_frame_logits

    assert not torch.isfinite(first_frame_logits(model, requests["cfg"])[0]).all()
    if half_kv:  # the reference stores its backbone keys/values in FP16 as the stepper's cache then does
        layers = model.config.backbone.num_hidden_layers
        monkeypatch.setattr(model.lm, "new_backbone_cache", lambda: RoundingKVCache(layers, torch.float16),
                            raising=False)
    with widened(model.lm):  # the safe precision: the same FP16 weights, every half-precision layer in FP32
        reference = {key: list(EagerFrameGenerator(model, req, "cpu")) for key, req in requests.items()}
    stepper = BatchedStepper(model, 2, "cpu", settings=FastPathSettings(half_kv=half_kv))
    assert stepper.step_buffers.cache.key.dtype == (torch.float16 if half_kv else torch.float32)
    with caplog.at_level(logging.WARNING, logger="breeze_worker.engine.batching"):
        frames, ends, errors = _run(stepper, list(requests.items()))
    assert errors == {} and ends == {"cfg": EndReason.FRAME_LIMIT, "plain": EndReason.FRAME_LIMIT}
    for key in requests:
        assert _equal(frames[key], reference[key]), key
        info = stepper.stream_info(key)
        assert info["nonfinite_events"] == len(frames[key]) == info["nonfinite_recovered"]  # every frame
        assert info["nonfinite_layer"] == OVERFLOWING  # the first in model order: the backbone's
    logged = [r.getMessage() for r in caplog.records if "held non-finite values" in r.getMessage()]
    assert len(logged) == 2  # once per request, however many of its frames were recovered
    assert all(OVERFLOWING in line and "goes on" in line for line in logged)


@contextlib.contextmanager
def _poisoned_rows(lm, rows: list[int], at: int):
    """NaN in `rows` of the frame embedding at the `at`-th batched backbone step (the step's embedding of every
    row of its prefix); a recomputation's own one-row embeddings are left alone."""
    original, calls = lm.embed_frames, {"n": 0}

    def poisoned(codes):
        out = original(codes)
        if codes.shape[0] > 1:
            calls["n"] += 1
            if calls["n"] == at:
                out = out.clone()
                out[rows] = float("nan")
        return out

    lm.embed_frames = poisoned
    try:
        yield calls
    finally:
        del lm.embed_frames


def test_only_the_stream_whose_rows_went_bad_is_recomputed(fp32_model):
    model = fp32_model
    requests = {"x": _request(model, "hello there", True, 1, 6), "y": _request(model, "a longer sentence", False, 2, 6)}
    alone = {key: list(EagerFrameGenerator(model, req, "cpu")) for key, req in requests.items()}
    stepper = BatchedStepper(model, 2, "cpu")
    assert stepper.join([("x", requests["x"])]) == {} and stepper.join([("y", requests["y"])]) == {}
    x_rows = list(stepper._streams["x"].rows)
    with _poisoned_rows(model.lm, x_rows, at=3) as calls:
        frames, ends, errors = _run(stepper, [])
    assert calls["n"] >= 3 and errors == {} and set(ends) == {"x", "y"}
    assert stepper.stream_info("x")["nonfinite_events"] == 1 == stepper.stream_info("x")["nonfinite_recovered"]
    assert stepper.stream_info("y")["nonfinite_events"] == 0
    assert _equal(frames["y"], alone["y"])  # the stream beside it is untouched
    assert _equal(frames["x"], alone["x"])  # and the recovered one: FP32's recomputation is the reference's


def test_frame_zero_is_recovered_from_the_prompt(fp32_model, monkeypatch):
    """NaN in the prefill's logits (the first frame's): both joiners' prompts are prefilled again for their rows."""
    model = fp32_model
    requests = {"a": _request(model, "hello there", True, 3, 4), "b": _request(model, "hi", False, 4, 4)}
    alone = {key: list(EagerFrameGenerator(model, req, "cpu")) for key, req in requests.items()}
    original, calls = model.lm.backbone_logits, {"n": 0}

    def first_nan(hidden):
        calls["n"] += 1
        out = original(hidden)
        return out + float("nan") if calls["n"] == 1 else out

    monkeypatch.setattr(model.lm, "backbone_logits", first_nan)
    stepper = BatchedStepper(model, 2, "cpu", batch_joins=True)  # one prefill for both, as on CUDA
    frames, ends, errors = _run(stepper, list(requests.items()))
    assert errors == {}
    for key in requests:
        assert stepper.stream_info(key)["nonfinite_events"] == 1, key
        assert _equal(frames[key], alone[key]), key


def test_a_frame_not_finite_at_the_safe_precision_ends_only_its_stream(fp32_model):
    """x's rows go bad and its recomputation does too (its one-row embeddings are NaN throughout): x ends with
    NumericalError, whose message does not invite a retry; y goes on as alone; the next stream on x's rows gives
    its frames alone (the rows' caches were scrubbed: a masked NaN is still NaN)."""
    model = fp32_model
    requests = {"x": _request(model, "hello there", True, 1, 6), "y": _request(model, "a longer sentence", False, 2, 6),
                "z": _request(model, "the next one", True, 5, 4)}
    alone = {key: list(EagerFrameGenerator(model, req, "cpu")) for key, req in requests.items()}
    stepper = BatchedStepper(model, 2, "cpu")
    assert stepper.join([("x", requests["x"]), ("y", requests["y"])]) == {}
    x_rows = list(stepper._streams["x"].rows)
    original = model.lm.embed_frames

    def broken(codes):
        out = original(codes)
        if codes.shape[0] == 1:  # every recomputation's embedding
            return out + float("nan")
        out = out.clone()
        out[x_rows] = float("nan")
        return out

    model.lm.embed_frames = broken
    try:
        frames, ends, errors = _run(stepper, [])
    finally:
        del model.lm.embed_frames
    assert set(errors) == {"x"} and isinstance(errors["x"], NumericalError)
    message = str(errors["x"])
    assert "retrying it will not help" in message and "--precision fp32" in message and "Retry" not in message
    info = stepper.stream_info("x")
    assert info["nonfinite_events"] == 1 and info["nonfinite_recovered"] == 0
    assert ends["y"] is EndReason.FRAME_LIMIT and _equal(frames["y"], alone["y"])
    assert stepper.join([("z", requests["z"])]) == {} and stepper._streams["z"].rows == x_rows
    frames, ends, errors = _run(stepper, [])
    assert errors == {} and _equal(frames["z"], alone["z"])


def test_the_job_reports_it_and_the_metric_counts_it(tmp_path):
    """Through the real Engine (fast path on the CPU, fp16-mixed forced): the massive activation appears after
    start-up (its probe saw none), the job finishes, its stats and their protobuf form name the layer, and the
    metric counts the frames as recovered."""
    from breeze_client._convert import stats_from_pb
    from breeze_worker.artifacts.store import ArtifactStore
    from breeze_worker.config import ArtifactSettings, EngineSettings
    from breeze_worker.engine.service import Engine
    from breeze_worker.engine.types import JobFinished
    from breeze_worker.transport.convert import event_to_pb

    torch.set_num_threads(1)
    settings = EngineSettings(device="cpu", fast_path="fast", precision="fp16-mixed", force_precision=True,
                              max_active_streams=2, max_queue=2)
    engine = Engine(settings, ArtifactStore(ArtifactSettings(directory=tmp_path)))
    asyncio.run(engine.start())
    try:
        mlp = engine.runtime.model.lm.backbone_model.layers[0].mlp
        with torch.no_grad():  # in place: the fast path's packed gate/up weight holds these views
            mlp.gate_proj.weight.mul_(STRESS)
            mlp.up_proj.weight.mul_(STRESS)

        async def run():
            async for event in engine.synthesize(SynthesisRequest(text="hello there", seed=3, max_frames=4)):
                if isinstance(event, JobFinished):
                    return event
        finished = asyncio.run(run())
        assert finished is not None and finished.stats.end_reason is EndReason.FRAME_LIMIT
        assert finished.stats.frames == 4 and finished.stats.nonfinite_events >= 1
        assert finished.stats.nonfinite_layer == OVERFLOWING
        client_stats = stats_from_pb(event_to_pb(finished, "127.0.0.1:1").finished.stats)
        assert client_stats.nonfinite_events == finished.stats.nonfinite_events
        assert client_stats.nonfinite_layer == OVERFLOWING
        metrics = engine.metrics.render()
        recovered = next(line for line in metrics.splitlines()
                         if line.startswith('breeze_nonfinite_events_total{outcome="recovered"}'))
        assert float(recovered.split()[-1]) == finished.stats.nonfinite_events
        assert 'breeze_nonfinite_events_total{outcome="failed"} 0.0' in metrics
    finally:
        asyncio.run(engine.stop())


def test_a_three_row_stream_is_recomputed_with_both_guidance_scales(fp32_model):
    """A stream with two guidance scales (rows: instruction, clone, plain) whose rows go bad is recomputed with the
    three-row combination u + s_ref*(r - u) + s*(i - u) at the backbone and every depth step: its frames are its
    eager frames alone (FP32), and the plain stream beside it is untouched."""
    import numpy as np

    from breeze_worker.engine.types import ReferenceInput, ResolvedReference

    model = fp32_model
    reference = ResolvedReference("ref-dual", "the reference words", np.random.RandomState(7).randint(0, 2048, (5, 16)),
                                  0.4)
    dual = SynthesisRequest(text="a sentence for voice direction", seed=7, max_frames=6, instruction="calm and slow",
                            reference=ReferenceInput(audio=b"RIFF", transcript=reference.transcript),
                            cfg_scale_reference=1.5, cfg_scale_instruction=2.5)
    requests = {"d": resolve_request(dual, model.generation_defaults, reference, tokenizer=model.tokenizer),
                "p": _request(model, "a longer sentence", False, 2, 6)}
    assert requests["d"].branches == 3
    alone = {key: list(EagerFrameGenerator(model, req, "cpu")) for key, req in requests.items()}
    stepper = BatchedStepper(model, 2, "cpu")
    assert stepper.join(list(requests.items())) == {}
    d_rows = list(stepper._streams["d"].rows)
    assert len(d_rows) == 3
    with _poisoned_rows(model.lm, d_rows, at=2) as calls:
        frames, ends, errors = _run(stepper, [])
    assert calls["n"] >= 2 and errors == {} and set(ends) == {"d", "p"}
    assert stepper.stream_info("d")["nonfinite_recovered"] == 1 and stepper.stream_info("p")["nonfinite_events"] == 0
    assert _equal(frames["p"], alone["p"])
    assert _equal(frames["d"], alone["d"])
