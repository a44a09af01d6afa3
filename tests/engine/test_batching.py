"""Continuous batching (engine/batching.py) on the tiny model in FP32 on the CPU: a stream's frames are
IDENTICAL alone (the eager reference) and batched, with streams joining and leaving mid-flight, different
prompt lengths, and CFG streams beside streams without CFG; slots are reused after a stream leaves."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import run_schedule

from breeze_worker.config import FastPathSettings
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
    frames, ends, _ = run_schedule(stepper, schedule, max_steps)
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
    from breeze_worker.measure import concurrency

    stepper = BatchedStepper(model, 2, "cpu")
    saved = []
    rows = concurrency.measure_concurrency(model, torch.device("cpu"), [1, 2], frames=2, seed=5, stepper=stepper,
                                           on_row=lambda rs: saved.append(len(rs)))
    assert [r["streams"] for r in rows] == [1, 2] and [r["cfg_streams"] for r in rows] == [1, 1]
    assert saved == [1, 2]  # the command rewrites its JSON after each level
    # the stepper given was used (an idle stepper has len() 0: `stepper or BatchedStepper(...)` built another)
    assert stepper.steps == 2 * (2 + 2 + 2)  # per level: the warm-up burst, the burst, the burst without codec
    assert [r["batch_shape"] for r in rows] == [[1, 2], [2, 3]]
    for r in rows:
        assert r["aggregate_x_realtime"] > 0 and 0 < r["ttfa_ms_p50"] <= r["ttfa_ms_p95"]
        assert r["stream_rtf_p50"] <= r["stream_rtf_max"]
        # no codec in this model: the step is the language model's, timed with and without the codec loop
        assert r["codec_ms_p50"] is None and 0 < r["lm_ms_p50"] and 0 < r["lm_only_step_ms_p50"]
    requests = concurrency.stream_requests(model, 2, 3, 5)
    alone = concurrency.alone_frames(stepper, requests, torch.device("cpu"))
    steps = stepper.steps
    for joins in (True, False):
        agree = concurrency.agreement(model, torch.device("cpu"), streams=2, frames=3, seed=5, stepper=stepper,
                                      batch_joins=joins, alone=alone)
        assert agree["identical_fraction"] == 1.0 and agree["first_differing_frame"] == [None, None]
        assert agree["prefill"] == ("batched" if joins else "per-stream") and stepper.batch_joins is False
    assert stepper.steps == steps + 2 * 3
    targets = concurrency.check_targets(rows, batch1_ms=1e9, batch1_source="test")
    assert targets["one_stream_lm_ms_per_frame"] == rows[0]["lm_only_step_ms_p50"]
    assert targets["one_stream_no_worse_than_batch1"] is True
    assert "LM-only" in concurrency.table(rows)


# ---- compiled bucket views, bucket shapes, cache bounds ----

# compiled (what a CUDA worker gets by default, "auto") with Dynamo's tracing but no code generation
COMPILED = FastPathSettings(compile="on", compile_backend="aot_eager")


def _compiled_env(monkeypatch, model):
    from dataclasses import replace

    # one attention bucket (256): fewer shapes to compile
    monkeypatch.setattr(model, "generation_defaults", replace(model.generation_defaults, max_sequence=256))


def test_compiled_bucket_views_give_the_frames_of_the_uncompiled_stepper(model, requests, alone, monkeypatch):
    _compiled_env(monkeypatch, model)
    r = requests
    schedule = {0: [("a", r["a"])], 2: [("b", r["b"]), ("d", r["d"])]}  # CFG beside plain, joining mid-flight
    frames = {}
    for name, settings in (("compiled", COMPILED), ("uncompiled", COMPILED.with_changes(compile="off"))):
        stepper = BatchedStepper(model, 3, "cpu", buckets=True, shapes=[(3, 6)], settings=settings)
        stats = stepper.stats()
        assert stats["compiled"] is (name == "compiled") and stats["compile_fallback"] is None
        if name == "compiled":
            view = stepper.graphs.views[(3, 6)]
            assert view.compiled and view is not stepper.step_buffers and not stepper.step_buffers.compiled
            assert stats["compile_s"] > 0 and stats["forms"] == {"3x6": view.form.name}
            assert view.form.name == "gemm+attention"  # the default batched form
        frames[name], _ = _run(stepper, schedule)
    assert set(frames["compiled"]) == set("abd")
    for key in "abd":
        assert len(frames["compiled"][key]) == len(frames["uncompiled"][key]) == len(alone[key])
        assert all(torch.equal(x, y) for x, y in zip(frames["compiled"][key], frames["uncompiled"][key])), key
    _assert_identical(frames["compiled"], alone, "abd")


def test_dynamic_shapes_compile_fewer_graphs_for_the_same_frames(model, requests, alone, monkeypatch):
    """The `dynamic_shapes` setting: two bucket shapes of one form traced as one symbolic graph per unit after
    the first, where static shapes trace each shape again; the frames are still each stream's alone."""
    import torch._dynamo

    _compiled_env(monkeypatch, model)
    schedule = {0: [("a", requests["a"])], 2: [("b", requests["b"]), ("d", requests["d"])]}
    graphs = {}
    for dynamic in (False, True):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        stepper = BatchedStepper(model, 3, "cpu", buckets=True, shapes=[(2, 4), (3, 6)],
                                 settings=COMPILED.with_changes(dynamic_shapes=dynamic))
        assert stepper.stats()["compile_fallback"] is None
        assert {v.form.name for v in stepper.graphs.views.values()} == {"gemm+attention"}
        graphs[dynamic] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        frames, _ = _run(stepper, schedule)
        _assert_identical(frames, alone, "abd")
    assert 0 < graphs[True] < graphs[False], graphs


def test_a_compile_error_leaves_the_bucket_views_uncompiled(model, requests, alone, monkeypatch):
    from breeze_worker.engine import batch_graphs

    _compiled_env(monkeypatch, model)

    def broken(fn, settings):
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(batch_graphs, "compile_unit", broken)
    stepper = BatchedStepper(model, 2, "cpu", buckets=True, settings=COMPILED)
    stats = stepper.stats()
    assert stats["compile_requested"] and not stats["compiled"]
    assert "no compiler today" in stats["compile_fallback"]
    assert not any(v.compiled for v in stepper.graphs.views.values())
    frames, _ = _run(stepper, {0: [("a", requests["a"]), ("d", requests["d"])]})
    _assert_identical(frames, alone, "ad")


def test_a_failing_kernel_leaves_the_batched_views_on_the_library_gemms(model, requests, alone, monkeypatch):
    """The default batched form (gemm+attention) whose Triton kernel cannot be built here (raises) falls back to
    the compiled "gemm" form, not to the uncompiled step, and says why; the frames stay those of each stream
    alone."""
    from breeze_worker.engine.fastpath import fused
    from breeze_worker.engine.fastpath.forms import select_form

    _compiled_env(monkeypatch, model)
    assert select_form(6, compiled=True).name == "gemm+attention"

    def broken(*args, **kwargs):
        raise RuntimeError("no attention kernel on this device")

    monkeypatch.setattr(fused, "depth_attention", broken)
    stepper = BatchedStepper(model, 3, "cpu", buckets=True, shapes=[(3, 6)], settings=COMPILED)
    stats = stepper.stats()
    assert stats["compiled"] and stats["forms"] == {"3x6": "gemm"}
    assert "no attention kernel on this device" in stats["compile_fallback"]
    assert "fallbacks" in stats["compile_fallback"]
    frames, _ = _run(stepper, {0: [("a", requests["a"]), ("d", requests["d"])]})
    _assert_identical(frames, alone, "ad")


def test_the_default_batched_form_serves_the_t4_policy(model, requests, monkeypatch):
    """Under fp16-mixed (FP16 weights, FP32 residual stream, caches and logits: what a T4 runs) the default
    batched form (gemm+attention) compiles without falling back and gives the uncompiled stepper's frames."""
    import copy

    from breeze_worker.engine.precision import apply_policy, make_policy

    _compiled_env(monkeypatch, model)
    mixed = copy.copy(model)
    mixed.lm = copy.deepcopy(model.lm)
    apply_policy(mixed.lm, make_policy("fp16-mixed", "test"), set())
    assert mixed.lm.depth_decoder.model.layers[0].mlp.down_proj.weight.dtype == torch.float16
    schedule = {0: [("a", requests["a"]), ("d", requests["d"])]}
    frames = {}
    for name, settings in (("compiled", COMPILED), ("uncompiled", COMPILED.with_changes(compile="off"))):
        stepper = BatchedStepper(mixed, 2, "cpu", buckets=True, shapes=[(2, 4)], settings=settings)
        stats = stepper.stats()
        assert stats["compile_fallback"] is None
        if name == "compiled":
            assert stats["compiled"] and stats["forms"] == {"2x4": "gemm+attention"}
        frames[name], _ = _run(stepper, schedule)
    for key in "ad":
        assert len(frames["compiled"][key]) == len(frames["uncompiled"][key]) > 0
        assert all(torch.equal(x, y) for x, y in zip(frames["compiled"][key], frames["uncompiled"][key])), key


def test_bucket_shapes_are_few_and_fit_half_cfg_bursts():
    from breeze_worker.engine.batching import bucket_shapes, pick_shape
    from breeze_worker.measure.concurrency import sweep_shapes

    shapes = bucket_shapes(32)
    assert sorted(shapes) == [(1, 2), (2, 4), (4, 8), (8, 16), (16, 32), (32, 48), (32, 64)]
    assert pick_shape(shapes, 32, 48) == (32, 48)  # 32 streams, 16 with CFG: not 64 rows
    assert pick_shape(shapes, 32, 49) == (32, 64) and pick_shape(shapes, 1, 1) == (1, 2)
    assert pick_shape(shapes, 5, 5) == (8, 16) and pick_shape(shapes, 33, 33) is None
    # a 1..32 sweep with the agreement at 8 needs six of them (one Dynamo compile per shape and unit)
    assert sweep_shapes(32, [1, 2, 4, 8, 16, 32], 8) == [(1, 2), (2, 4), (4, 8), (8, 16), (16, 32), (32, 48)]
    assert bucket_shapes(3) == [(1, 2), (2, 4), (3, 6)]


def test_rows_far_into_the_cache_beside_a_young_stream_stay_inside_the_attention_bucket(model, monkeypatch):
    """Every row of a step's prefix writes one cache slot at its own position, so the step's attention bucket
    must hold them all: the last step of a stream whose position passed the first bucket ("long"), and an
    idle row that kept advancing ("gone", cancelled at once) beside a young stream in the first bucket
    ("young"). On CUDA an out-of-range cache write is a device-side error; on the CPU it raises."""
    from breeze_worker.engine.fastpath import static_cache

    monkeypatch.setattr(static_cache, "BUCKETS", (96,) + static_cache.BUCKETS[1:])  # a first bucket reached sooner
    BUCKETS = static_cache.BUCKETS
    gone = _request(model, "short one", False, 10, 50)
    long = _request(model, "a much longer sentence with many more words in it than the others", False, 11, 1000)
    young = _request(model, "hi", True, 12, 15)
    stepper = BatchedStepper(model, 3, "cpu")
    assert stepper.join([("gone", gone), ("long", long)]) == {}
    assert stepper._streams["gone"].rows == [0] and stepper._streams["long"].rows == [1]
    stepper.step()
    stepper.leave("gone")  # row 0 stays inside the prefix, idle, its position advancing every step
    last = BUCKETS[0] + 6  # the step of long's last frame: by then row 0 is past the first bucket too
    stepper._streams["long"].limit = last
    young_frames, ends = [], {}
    for n in range(1, last + 12):
        if n == last - 8:
            assert stepper.join([("young", young)]) == {}
            assert stepper._streams["young"].rows == [2, 3]  # a CFG pair above the idle row 0
        for key, out in stepper.step().items():
            assert out.error is None
            if key == "young" and out.frame is not None:
                young_frames.append(out.frame)
            if out.end_reason is not None:
                ends[key] = out.end_reason
    assert ends == {"long": EndReason.FRAME_LIMIT, "young": EndReason.FRAME_LIMIT} and len(young_frames) == 15
    assert stepper._row_pos[0] < BUCKETS[0]  # the idle row was restarted rather than written out of range
    want = list(EagerFrameGenerator(model, young, "cpu"))
    assert all(torch.equal(a, b) for a, b in zip(young_frames, want))


def test_concurrency_sweep_with_the_codec_both_overlap_modes():
    """With a codec: each burst runs in the engine's order with the overlap on and, compared, off; the frames
    and the number of audio deliveries are the same, and every stream gets first audio before it is done."""
    from breeze_worker.measure import concurrency
    from breeze_worker.model.tiny import tiny_model

    model = tiny_model(seed=0)
    stepper = BatchedStepper(model, 2, "cpu")
    requests = concurrency.stream_requests(model, 2, 3, 7)
    runs = {overlap: concurrency.run_burst(stepper, model.codec, requests, torch.device("cpu"), overlap=overlap)
            for overlap in (True, False)}
    for overlap, r in runs.items():
        assert r["overlap"] is overlap and len(r["codec_ms"]) == 3 and all(ms > 0 for ms in r["codec_ms"])
        assert all(r["t0"] < r["first_audio"][k] <= r["done"][k] for k in (0, 1))
    for k in (0, 1):
        assert len(runs[True]["frames"][k]) == 3
        assert all(torch.equal(a, b) for a, b in zip(runs[True]["frames"][k], runs[False]["frames"][k]))
    [row] = concurrency.measure_concurrency(model, torch.device("cpu"), [2], frames=3, seed=7, stepper=stepper,
                                            lm_only=False, compare_overlap=True)
    assert row["overlap"] is False and row["other_overlap"]["overlap"] is True  # the worker's default: serial
    assert row["codec_ms_p50"] > 0 and row["other_overlap"]["codec_ms_p50"] > 0
    assert "off" in concurrency.table([row]).splitlines()[1]


def test_put_rows_writes_each_listed_row_its_value_and_leaves_the_rest():
    """The sync-free slot writes behind set_streams and release: each listed row takes its scalar throughout
    (a 2-D buffer's whole row), unlisted rows keep theirs, values keep the buffer's dtype."""
    from breeze_worker.engine.fastpath.step import put_rows

    ints = torch.full((4, 3), 7, dtype=torch.int64)
    put_rows(ints, [2, 0], [5, -1])
    assert ints.tolist() == [[-1] * 3, [7] * 3, [5] * 3, [7] * 3]
    floats = torch.zeros(3)
    put_rows(floats, [1], [0.9])
    assert floats[1].item() == torch.tensor(0.9, dtype=torch.float32).item() and floats[[0, 2]].eq(0).all()
    flags = torch.ones(2, 5, dtype=torch.bool)
    put_rows(flags, [1], [False])
    assert flags[0].all() and not flags[1].any()
