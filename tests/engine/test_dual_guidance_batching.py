"""Streams with two guidance scales (three model rows) in the batched step (engine/batching.py) on the tiny model
in FP32 on the CPU: beside one- and two-row streams in the same steps, joining and leaving mid-flight, on rows
that are not contiguous, compiled, each stream's frames are IDENTICAL to the eager generator's alone; rows are
counted at the join."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import run_schedule

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.batching import BatchedStepper, bucket_shapes, pick_shape
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import (
    EndReason,
    ReferenceInput,
    ResolvedReference,
    SamplingOverrides,
    SynthesisRequest,
)
from breeze_worker.errors import ResourceExhausted


@pytest.fixture(scope="module")
def model():
    from breeze_worker.model.tiny import tiny_model

    torch.set_num_threads(1)
    return tiny_model(seed=0, with_codec=False)


def _request(model, kind: str, seed: int, frames: int, text: str = "hello there", greedy: bool = False):
    """kind: plain (1 row), cfg (2), dual (3: reference, transcript, instruction and two scales)."""
    reference = None
    extra: dict = {}
    if kind == "dual":
        codes = np.random.RandomState(seed).randint(0, 2048, (4 + seed % 3, 16))
        reference = ResolvedReference(f"ref-{seed}", "the reference words", codes, 0.4)
        extra = dict(reference=ReferenceInput(audio=b"RIFF", transcript=reference.transcript),
                     instruction="calm and slow", cfg_scale_reference=1.5 + 0.25 * (seed % 2),
                     cfg_scale_instruction=2.0)
    elif kind == "cfg":
        extra = dict(instruction="calm and slow", cfg_scale=2.0)
    sampling = SamplingOverrides(temperature=0.0) if greedy else SamplingOverrides()
    req = SynthesisRequest(text=text, seed=seed, max_frames=frames, sampling=sampling, **extra)
    resolved = resolve_request(req, model.generation_defaults, reference, tokenizer=model.tokenizer)
    assert resolved.branches == {"plain": 1, "cfg": 2, "dual": 3}[kind]
    return resolved


@pytest.fixture(scope="module")
def requests(model):
    return {
        "x": _request(model, "dual", 1, 7, "a sentence for the first voice direction"),
        "b": _request(model, "plain", 2, 8, "a much longer sentence with many more words in it than the others"),
        "c": _request(model, "cfg", 3, 5, "hi"),
        "y": _request(model, "dual", 4, 6, "short one", greedy=True),
        "d": _request(model, "plain", 5, 3, "joins after a slot was freed"),
        "z": _request(model, "dual", 6, 4, "last to join"),
    }


@pytest.fixture(scope="module")
def alone(model, requests):
    return {key: list(EagerFrameGenerator(model, req, "cpu")) for key, req in requests.items()}


def _assert_identical(frames, alone, keys):
    for key in keys:
        assert len(frames[key]) == len(alone[key]) > 0, key
        for got, want in zip(frames[key], alone[key]):
            assert torch.equal(got, want), key


@pytest.mark.parametrize("batch_joins, buckets", [(False, False), (True, False), (False, True)])
def test_three_row_streams_beside_one_and_two_row_streams_give_each_streams_frames_alone(model, requests, alone,
                                                                                        batch_joins, buckets):
    stepper = BatchedStepper(model, 5, "cpu", batch_joins=batch_joins, buckets=buckets)
    r = requests
    # x (3 rows) and b (1) start; c (2) and y (3) join at step 2; d (1) and z (3) once c and y have left
    schedule = {0: [("x", r["x"]), ("b", r["b"])], 2: [("c", r["c"]), ("y", r["y"])],
                8: [("d", r["d"]), ("z", r["z"])]}
    frames, ends, layouts = run_schedule(stepper, schedule)
    _assert_identical(frames, alone, "xbcydz")
    assert set(ends) == set("xbcydz") and all(end is EndReason.FRAME_LIMIT for end in ends.values())
    # one step held every kind of stream at once: 1, 2 and 3 rows
    assert any({len(rows) for rows in step.values()} == {1, 2, 3} for step in layouts)
    assert all(len(step[k]) == 3 for step in layouts for k in "xyz" if k in step)
    assert stepper.host_reads == stepper.steps and len(stepper) == 0 and stepper.rows_free == stepper.max_rows


def test_a_three_row_stream_on_rows_that_are_not_contiguous(model, requests, alone):
    """Rows freed here and there: the next stream with two guidance scales takes the lowest free rows, each
    prefilled on its own, and still gives its frames alone."""
    stepper = BatchedStepper(model, 5, "cpu")
    p = {k: _request(model, "plain", 10 + i, 12) for i, k in enumerate("pqr")}
    assert stepper.join([("p", p["p"]), ("q", p["q"]), ("r", p["r"]), ("c", requests["c"]),
                         ("x", requests["x"])]) == {}
    assert [stepper._streams[k].rows for k in "pqrcx"] == [[0], [1], [2], [3, 4], [5, 6, 7]]
    outcomes = stepper.step()
    stepper.leave("p")
    stepper.leave("r")
    assert stepper.rows_free == 4  # rows 0, 2, 8, 9
    assert stepper.join([("z", requests["z"])]) == {}
    assert stepper._streams["z"].rows == [0, 2, 8]
    frames = {"c": [outcomes["c"].frame], "x": [outcomes["x"].frame]}
    while len(stepper):
        for key, out in stepper.step().items():
            assert out.error is None
            if out.frame is not None:
                frames.setdefault(key, []).append(out.frame)
    _assert_identical(frames, alone, "cxz")


def test_rows_are_counted_at_the_join(model, requests, alone):
    """Two slots hold four rows: beside a CFG stream a stream with two guidance scales is refused (its slot is
    free, its rows are not) with ResourceExhausted saying so; once the rows are free it joins."""
    stepper = BatchedStepper(model, 2, "cpu")
    assert stepper.max_rows == 4 and stepper.rows_for(requests["x"]) == 3
    assert stepper.join([("c", requests["c"])]) == {}
    errors = stepper.join([("x", requests["x"]), ("d", requests["d"])])
    assert set(errors) == {"x"} and isinstance(errors["x"], ResourceExhausted)
    assert "2 of the 4 model rows are free and this request needs 3" in str(errors["x"])
    assert "x" not in stepper._streams and stepper.free_slots == 0  # d took the free slot and one row
    stepper.leave("c")
    stepper.leave("d")
    assert stepper.join([("x", requests["x"])]) == {}
    frames, _, _ = run_schedule(stepper, {0: []})
    _assert_identical(frames, alone, "x")


def test_one_slot_holds_a_stream_with_two_guidance_scales(model, requests, alone):
    """A one-stream stepper has three rows, and on CUDA a (1, 3) bucket beside (1, 2), so such a stream runs
    there too (and a plain stream still takes the two-row bucket)."""
    assert bucket_shapes(1) == [(1, 2), (1, 3)]
    assert pick_shape(bucket_shapes(1), 1, 3) == (1, 3) and pick_shape(bucket_shapes(1), 1, 1) == (1, 2)
    assert pick_shape(bucket_shapes(2), 1, 3) == (2, 4)  # otherwise the next bucket covers the third row
    stepper = BatchedStepper(model, 1, "cpu", buckets=True)
    assert stepper.max_rows == 3
    frames, _, _ = run_schedule(stepper, {0: [("y", requests["y"])]})
    _assert_identical(frames, alone, "y")


def test_compiled_bucket_views_give_a_three_row_stream_its_frames_alone(model, requests, alone, monkeypatch):
    """The compiled units (Dynamo tracing, no code generation) over a bucket where a stream with two guidance
    scales steps beside a CFG stream and a plain one."""
    from dataclasses import replace

    monkeypatch.setattr(model, "generation_defaults", replace(model.generation_defaults, max_sequence=256))
    settings = FastPathSettings(compile="on", compile_backend="aot_eager")
    stepper = BatchedStepper(model, 3, "cpu", buckets=True, shapes=[(3, 6)], settings=settings)
    assert stepper.stats()["compiled"] and stepper.stats()["compile_fallback"] is None
    r = requests
    frames, _, layouts = run_schedule(stepper, {0: [("x", r["x"]), ("c", r["c"])], 1: [("b", r["b"])]})
    assert any({len(rows) for rows in step.values()} == {1, 2, 3} for step in layouts)
    _assert_identical(frames, alone, "xcb")
