"""Continuous batching (engine/batching.py) on the tiny model in FP32 on the CPU: a stream's frames are
IDENTICAL alone (the eager reference) and batched, with streams joining and leaving mid-flight, different
prompt lengths, and CFG streams beside streams without CFG; slots are reused after a stream leaves."""

from __future__ import annotations

import pytest
import torch

from breeze_worker.engine.batching import BatchedStepper
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import EndReason, SynthesisRequest
from breeze_worker.errors import ResourceExhausted


@pytest.fixture(scope="module")
def model():
    from breeze_worker.model.tiny import tiny_model

    torch.set_num_threads(1)
    return tiny_model(seed=0, with_codec=False)


def _request(model, text: str, cfg: bool, seed: int, frames: int):
    req = SynthesisRequest(text=text, instruction="calm and slow" if cfg else None, cfg_scale=2.0 if cfg else None,
                           seed=seed, max_frames=frames)
    return resolve_request(req, model.generation_defaults, None, tokenizer=model.tokenizer)


@pytest.fixture(scope="module")
def requests(model):
    return {  # different prompt lengths, CFG and not, different frame limits
        "a": _request(model, "hello there", True, 1, 6),
        "b": _request(model, "a much longer sentence with many more words in it than the others", False, 2, 8),
        "c": _request(model, "hi", True, 3, 5),
        "d": _request(model, "short one", False, 4, 3),
        "e": _request(model, "joins after a slot was freed", True, 5, 4),
    }


@pytest.fixture(scope="module")
def alone(model, requests):
    return {key: list(EagerFrameGenerator(model, req, "cpu")) for key, req in requests.items()}


def _run(stepper, schedule: dict[int, list], max_steps: int = 50):
    """Step until every stream ended; `schedule` {step index: [(key, request), ...]} joins at boundaries."""
    frames, ends = {}, {}
    for n in range(max_steps):
        if n in schedule:
            assert stepper.join(schedule[n]) == {}
        if not len(stepper) and n > max(schedule):
            break
        for key, out in stepper.step().items():
            assert out.error is None
            if out.frame is not None:
                frames.setdefault(key, []).append(out.frame)
            if out.end_reason is not None:
                ends[key] = out.end_reason
    return frames, ends


def _assert_identical(frames, alone, keys):
    for key in keys:
        assert len(frames[key]) == len(alone[key]), key
        for got, want in zip(frames[key], alone[key]):
            assert got.dtype == torch.int64 and got.shape == (16,)
            assert torch.equal(got, want), key


@pytest.mark.parametrize("batch_joins, buckets", [(False, False), (True, False), (False, True)])
def test_joining_and_leaving_mid_flight_gives_the_frames_of_each_stream_alone(model, requests, alone, batch_joins,
                                                                              buckets):
    stepper = BatchedStepper(model, 4, "cpu", batch_joins=batch_joins, buckets=buckets)
    r = requests
    # a, b start; c, d join at step 2; d leaves after 3 frames (step 5), a after 6 (step 6); e joins at step 6
    schedule = {0: [("a", r["a"]), ("b", r["b"])], 2: [("c", r["c"]), ("d", r["d"])], 6: [("e", r["e"])]}
    frames, ends = _run(stepper, schedule)
    _assert_identical(frames, alone, "abcde")
    assert all(end is EndReason.FRAME_LIMIT for end in ends.values()) and set(ends) == set("abcde")
    # the streams shared steps: far fewer steps than frames
    assert stepper.steps < sum(len(f) for f in frames.values()) // 2
    assert stepper.host_reads == stepper.steps and len(stepper) == 0 and stepper.free_slots == 4


def test_cfg_stream_takes_two_rows_and_a_plain_stream_one(model, requests, alone):
    stepper = BatchedStepper(model, 3, "cpu")
    stepper.join([("b", requests["b"]), ("a", requests["a"])])
    rows = {key: stepper._streams[key].rows for key in ("a", "b")}
    assert len(rows["b"]) == 1 and len(rows["a"]) == 2 and not set(rows["a"]) & set(rows["b"])
    frames, _ = _run(stepper, {0: []})
    _assert_identical(frames, alone, "ab")


def test_a_stream_that_leaves_frees_its_slot_for_the_next_join(model, requests):
    stepper = BatchedStepper(model, 2, "cpu")
    assert stepper.join([("a", requests["a"]), ("b", requests["b"])]) == {}
    errors = stepper.join([("c", requests["c"])])
    assert isinstance(errors["c"], ResourceExhausted) and "2 stream slots" in str(errors["c"])
    stepper.step()
    stepper.leave("a")  # e.g. cancelled: gone before the next step
    assert stepper.free_slots == 1 and set(stepper.step()) == {"b"}
    assert stepper.join([("c", requests["c"])]) == {}
    assert set(stepper.step()) == {"b", "c"}
    assert stepper.stream_info("a")["generate_s"] > 0


def test_concurrency_sweep_measures_every_level_and_agreement(model):
    from breeze_worker.bench import concurrency

    stepper = BatchedStepper(model, 2, "cpu")
    rows = concurrency.measure_concurrency(model, torch.device("cpu"), [1, 2], frames=2, seed=5, stepper=stepper)
    assert [r["streams"] for r in rows] == [1, 2] and [r["cfg_streams"] for r in rows] == [1, 1]
    for r in rows:
        assert r["aggregate_x_realtime"] > 0 and 0 < r["ttfa_ms_p50"] <= r["ttfa_ms_p95"]
        assert r["stream_rtf_p50"] <= r["stream_rtf_max"]
    agree = concurrency.agreement(model, torch.device("cpu"), streams=2, frames=3, seed=5, stepper=stepper)
    assert agree["identical_fraction"] == 1.0 and agree["first_differing_frame"] == [None, None]
    assert "streams" in concurrency.table(rows)
