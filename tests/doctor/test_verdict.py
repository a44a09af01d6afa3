"""The verdict from recorded figures: pure functions, no device.

The projection is checked against measurements it was not fitted to where the repository has them: applied
to the H200 with its measured copy bandwidth it must give back the recorded batch-1 and batched figures, and
the T4's batch-1 figure must equal the projection docs/performance.md records from the fp16-mixed H200
measurement (bytes / 320 GB/s + measured overhead). The stop condition is reached only from figures measured on
the device; a projection (a lower bound on the LM time) can only show it not reached."""

from __future__ import annotations

import dataclasses

import pytest

from breeze_worker.doctor.figures import (
    FRAME_MS,
    GPU_CLASSES,
    H200_REFERENCE,
    STOP_RATIO,
    BatchedPoint,
    Figures,
    class_of_device,
    gpu_class,
)
from breeze_worker.doctor.verdict import (
    NOT_REACHED,
    REACHED,
    UNDECIDED,
    HostContext,
    best_throughput,
    cost_per_audio_hour,
    floor_ms,
    project_batched,
    project_class,
    rows_for,
    rtf,
    stop_condition,
    streams_that_fit,
    streams_within,
    verdict,
    x_realtime,
)

PARAMS = H200_REFERENCE.bytes_per_frame["bf16"] / 2  # weights streamed per frame (bf16: 2 bytes each)
MODEL = {"bf16": 6_157_603_588, "fp16-mixed": 6_968_011_524}
SLOT = {"bf16": 470_155_264, "fp16-mixed": 940_310_528}


def _t4() -> Figures:
    return project_class(gpu_class("T4"), H200_REFERENCE, params_per_frame=PARAMS, model_bytes=MODEL,
                         stream_bytes=SLOT)


def test_floor_rtf_and_throughput_arithmetic():
    assert floor_ms(12_957_329_408, 4.26e12) == pytest.approx(3.0416, abs=1e-3)
    assert floor_ms(1, None) is None and floor_ms(1, 0.0) is None
    assert rtf(40.0) == 0.5 and rtf(FRAME_MS) == 1.0
    assert x_realtime(4, 80.0) == 4.0 and x_realtime(32, 20.0) == 128.0
    assert [rows_for(n) for n in (1, 2, 3, 4, 32)] == [2, 3, 5, 6, 48]  # half with CFG, the first included
    assert cost_per_audio_hour(0.526, 8.77 ** -1) == pytest.approx(0.526 * 8.77)  # today's T4: RTF 8.77


def test_projection_gives_back_the_reference_on_the_reference_device():
    ref = H200_REFERENCE
    floor = ref.floor_ms("bf16")
    points = project_batched(ref.batched[0].lm_ms, ref.batched[0].codec_ms, floor, PARAMS, ref.half_tflops,
                             ref.fp32_tflops, ref)
    for got, recorded in zip(points, ref.batched):
        assert got.streams == recorded.streams
        assert got.lm_ms == pytest.approx(recorded.lm_ms) and got.codec_ms == pytest.approx(recorded.codec_ms)
    # the recorded 32-stream run: 112.6x aggregate, 127.7x steady (step 20.04 ms); the projection's step is its own
    assert x_realtime(32, points[-1].step_ms) == pytest.approx(32 * 80 / (10.68 + 9.10))


def test_t4_projection_matches_the_recorded_formula_and_never_says_stop():
    t4 = _t4()
    assert t4.policy == "fp16-mixed"  # compute capability 7.5
    floor = 13_029_756_928 / 320e9 * 1000
    assert t4.lm_ms_cfg == pytest.approx(floor + (9.37 - 13_029_756_928 / 4.26e12 * 1000))
    assert t4.lm_ms_cfg == pytest.approx(47.0, abs=0.1)  # docs/perf-data/batch1-fp16mixed-435d551-20261202.json: 47.02
    v = verdict(t4, HostContext(measured=False, emulates_bf16=True), price_per_hour=0.526)
    assert v.within is None  # no stream reaches RTF 0.5: the floor alone is 40.7 of the 40 ms budget
    assert v.rtf_batch1 > 0.5 and v.stop.ratio < STOP_RATIO
    # a projected LM time is a lower bound: under the threshold it decides nothing
    assert v.stop.state == UNDECIDED and not v.stop.stop and not v.stop.measured
    assert v.fits == 6  # 16 GB: 7.0 GB model + fixed + FP32 caches of 0.94 GB a slot
    assert v.best.streams == 4 and rtf(v.best.step_ms) <= 1.0
    assert v.cost["batch1_per_audio_hour"] == pytest.approx(0.526 * v.batch1_ms / FRAME_MS)
    assert any("none" in line and "RTF <= 0.5" in line for line in v.lines)
    stop_line = next(line for line in v.lines if line.startswith("stop condition"))
    assert "reached:" not in stop_line.replace("not reached", "") and "undecided" in stop_line
    assert "projected" in stop_line and "breeze-worker doctor --device cuda" in stop_line
    assert not any("stop optimizing" in line for line in v.next_steps)
    assert any(line.startswith("measure before deciding anything on kernels: on the T4") for line in v.next_steps)
    assert any("fp16-mixed" in line for line in v.next_steps)  # BF16 is emulated there
    assert "(projected:" in v.lines[0]


def test_a_projection_above_the_threshold_says_not_reached():
    """The projected LM time is a lower bound: a projected ratio above the threshold proves the measured one is too."""
    slow = dataclasses.replace(_t4(), lm_ms_cfg=_t4().lm_ms_cfg * 2)
    v = verdict(slow, HostContext(measured=False))
    assert v.stop.state == NOT_REACHED and v.stop.ratio > STOP_RATIO
    assert any("not reached, even on the projection" in line for line in v.lines)
    assert not any("stop optimizing" in s or s.startswith("the LM spends") for s in v.next_steps)


def test_the_same_figures_measured_on_the_device_say_reached():
    """Figures the doctor measured on this GPU (nothing in `projected` but the batched steps) decide the condition."""
    measured = dataclasses.replace(_t4(), projected=frozenset({"batched"}))
    v = verdict(measured, HostContext(emulates_bf16=True))
    assert v.stop.state == REACHED and v.stop.stop and v.stop.measured
    assert any("reached: more kernel work cannot pay here" in line and "measured here" in line for line in v.lines)
    assert any(line.startswith("stop optimizing kernels") for line in v.next_steps)
    # a measured LM time against a datasheet (projected) bandwidth is not a measured stop condition
    half = dataclasses.replace(measured, projected=frozenset({"batched", "bandwidth"}))
    assert verdict(half, HostContext()).stop.state == UNDECIDED


def test_measured_h200_like_figures_say_kernel_work_can_still_pay():
    fig = Figures(device="NVIDIA H200", source="test", policy="bf16", bandwidth=4.26e12,
                  bytes_per_frame=H200_REFERENCE.bytes_per_frame["bf16"], lm_ms_cfg=7.90, codec_ms=2.71,
                  memory_bytes=143_000_000_000, model_bytes=MODEL["bf16"], fixed_bytes=2_000_000_000,
                  stream_bytes=SLOT["bf16"], batched=H200_REFERENCE.batched)
    v = verdict(fig)
    assert not v.stop.stop and v.stop.ratio == pytest.approx(7.90 / H200_REFERENCE.floor_ms("bf16"))
    assert v.within.streams == 32 and v.rtf_batch1 == pytest.approx((7.90 + 2.71) / 80)
    assert any("profile it with `breeze-worker bench" in s for s in v.next_steps)
    assert any("--max-active-streams 32" in s for s in v.next_steps)
    assert any(line.startswith("RTF at batch 1") and "(measured:" in line for line in v.lines)


def test_memory_caps_the_streams_and_says_so():
    fig = dataclasses.replace(_t4(), memory_bytes=8_500_000_000, projected=frozenset())
    v = verdict(fig)
    assert v.fits == 0 and v.within is None and v.best is None
    assert any("not even one stream slot fits" in line for line in v.lines)
    fast = tuple(BatchedPoint(n, 10.0 + n / 8, 3.0 + n / 4) for n in (1, 2, 4, 8, 16, 32))  # all RTF < 0.5
    v = verdict(dataclasses.replace(_t4(), memory_bytes=11_000_000_000, batched=fast))
    assert v.fits == 1 and v.within.streams == 1  # 9.9 GB usable - 7.0 model - 1.15 fixed: one 0.94 GB slot
    assert any(s.startswith("memory, not speed, limits") for s in v.next_steps)


def test_stream_counting_helpers():
    points = (BatchedPoint(1, 30.0, 5.0), BatchedPoint(2, 32.0, 6.0), BatchedPoint(4, 33.0, 8.0),
              BatchedPoint(8, 40.0, 15.0), BatchedPoint(16, 50.0, 40.0))  # steps 35, 38, 41, 55, 90 ms
    assert streams_within(points, 0.5).streams == 2  # 4 streams: 41 ms, RTF 0.5125
    assert streams_within(points, 0.52).streams == 4 and streams_within(points, 0.4) is None
    assert streams_within(points, 0.52, max_streams=2).streams == 2
    assert best_throughput(points, 1.0).streams == 8  # 16 streams: 90 ms a step, RTF 1.125
    assert best_throughput(points, 1.0, max_streams=3).streams == 2
    assert streams_that_fit(10_000, 3_000, 1_000, 1_000, headroom=0.1) == 5
    assert streams_that_fit(10_000, 9_500, 1_000, 1_000) == 0
    assert streams_that_fit(None, 1, 1, 1) is None and streams_that_fit(1, 1, 1, 0) is None


def test_stop_condition_threshold():
    assert stop_condition(None, 3.0) is None and stop_condition(8.0, None) is None
    assert stop_condition(1.2, 1.0).stop and not stop_condition(1.3, 1.0).stop
    assert stop_condition(STOP_RATIO, 1.0).stop  # at the ratio: stop
    assert stop_condition(1.2, 1.0, measured=False).state == UNDECIDED  # a projection never says stop
    assert stop_condition(1.3, 1.0, measured=False).state == NOT_REACHED
    assert stop_condition(7.9, 3.04).overhead_ms == pytest.approx(4.86)


def test_next_steps_order_busy_and_nonfinite_first():
    v = verdict(_t4(), HostContext(busy=True, nonfinite=True, emulates_bf16=True, startup_s=60.0, compile_s=40.0))
    assert v.next_steps[0].startswith("re-run `breeze-worker doctor` on an idle GPU")
    assert "--precision fp32" in v.next_steps[1]
    last = v.next_steps[-1]
    assert last.startswith("keep the worker long-lived") and "40 s of it compiling" in last
    assert f"{60_000 / v.batch1_ms:,.0f} frames" in last


def test_every_class_projects_consistently():
    rows = [project_class(c, H200_REFERENCE, params_per_frame=PARAMS, model_bytes=MODEL, stream_bytes=SLOT)
            for c in GPU_CLASSES]
    for fig in rows:
        v = verdict(fig, HostContext(measured=False))
        assert v.floor_ms == pytest.approx(1000 * fig.bytes_per_frame / fig.bandwidth)
        assert v.batch1_ms > v.floor_ms  # overhead and codec on top of the floor
        assert [p.streams for p in fig.batched] == [1, 2, 4, 8, 16, 32]
        assert fig.batched[0].step_ms == pytest.approx(v.batch1_ms)  # one stream batched = batch 1
    by = {f.device: f for f in rows}
    assert by["T4"].policy == "fp16-mixed" and all(f.policy == "bf16" for n, f in by.items() if n != "T4")
    # 300 GB/s: the L4's floor is above the T4's even though the T4 streams FP32 logit heads
    assert floor_ms(by["L4"].bytes_per_frame, by["L4"].bandwidth) > floor_ms(by["T4"].bytes_per_frame, 320e9)


@pytest.mark.parametrize("name,expected", [("Tesla T4", "T4"), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
                                           ("NVIDIA A10G", "A10"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
                                           ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H200", "H200"),
                                           ("NVIDIA GeForce RTX 4090", None)])
def test_device_names_map_to_classes(name, expected):
    found = class_of_device(name)
    assert (found.name if found else None) == expected


def test_unknown_class_is_a_clear_error():
    with pytest.raises(ValueError, match="known: T4, L4"):
        gpu_class("V100")
    assert gpu_class("t4").name == "T4"


def test_the_t4_before_and_after_its_16_bit_options():
    """The doctor's own projection of a 16 GB T4 with the FP32 caches and codec, then the backbone's KV cache in
    FP16 (half its slot) and the codec's convolutions in FP16 (its growth with streams scaled by the FP16
    tensor-core peak instead of the FP32 one)."""
    from breeze_worker.doctor import footprint
    from breeze_worker.doctor.report import T4_OPTIONS, t4_options
    from breeze_worker.model.synthetic import config_for

    config = config_for("full")
    fp32_slot = footprint.stream_bytes(config, "fp16-mixed", 2048)
    half_slot = footprint.stream_bytes(config, "fp16-mixed", 2048, half_kv=True)
    assert fp32_slot == SLOT["fp16-mixed"]
    assert footprint.stream_bytes(config, "bf16", 2048, half_kv=True) == SLOT["bf16"]  # only under fp16-mixed
    depth = 2 * 2 * 12 * 2 * 128 * 16 * 4  # two rows of FP32 depth keys and values: not halved
    assert half_slot == (fp32_slot - depth) // 2 + depth
    assert footprint.codec_bytes(half=True) < footprint.codec_bytes() < 2 * footprint.codec_bytes(half=True)
    rows = {r["option"]: r for r in t4_options(config)}
    assert list(rows) == [label for label, _, _ in T4_OPTIONS]
    before, kv, codec, both = rows.values()
    assert all(r["streams_rtf_0_5"] == 0 for r in rows.values())  # the floor alone is 40.7 of the 40 ms budget
    assert (before["slots"], before["streams_rtf_1"]) == (6, 4) and before["x_realtime"] == pytest.approx(5.6, abs=0.05)
    assert kv["slots"] == both["slots"] == 13 and kv["streams_rtf_1"] == both["streams_rtf_1"] == 8
    assert codec["slots"] == 6 and codec["codec_ms"] < before["codec_ms"]
    t4 = gpu_class("T4")
    growth = H200_REFERENCE.codec_growth_ms(8)
    assert kv["codec_ms"] == pytest.approx(2.71 + growth * 67.0 / t4.fp32_tflops)
    assert both["codec_ms"] == pytest.approx(2.71 + growth * 67.0 / t4.half_tflops)
    assert both["x_realtime"] > kv["x_realtime"] > before["x_realtime"]
