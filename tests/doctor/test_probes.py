"""The probes and their wiring, run for real on the CPU with the tiny model (the GPU-only probes say why they
did not run), the refusals (busy, too small, time budget), and the report a CUDA run produces, built from
figures shaped as the probes return them."""

from __future__ import annotations

import json

import pytest
import torch

from breeze_worker.doctor import footprint
from breeze_worker.doctor.facts import DeviceFacts
from breeze_worker.doctor.figures import H200_REFERENCE
from breeze_worker.doctor.probes import PROBES, MeasureOptions, ModelSpec, load_model, measure, refuse_small
from breeze_worker.doctor.report import build, host_figures, policy_section, text
from breeze_worker.doctor.verdict import HostContext
from breeze_worker.engine.precision import HalfLinear
from breeze_worker.model.synthetic import config_for

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny_run():
    torch.set_num_threads(1)
    options = MeasureOptions(frames=4, repeats=1, check_frames=2, budget_s=600)
    return measure(CPU, ModelSpec(size="tiny", seed=3), "fp32", busy_reasons=[], options=options)


def test_every_probe_is_measured_or_says_why(tiny_run):
    measured, missing = tiny_run
    assert set(missing) == {"copy_bandwidth", "memory"}  # GPU figures
    assert missing["copy_bandwidth"].startswith("no CUDA device") and missing["memory"].startswith("no CUDA device")
    assert {p for p in PROBES if p in measured} == set(PROBES) - set(missing)
    load = measured["load"]
    assert load["policy"] == "fp32" and load["model"] == "random-tiny" and load["load_s"] > 0


def test_floor_startup_fast_path_and_precision_figures(tiny_run):
    measured, _ = tiny_run
    floor = measured["floor"]["bytes_per_frame"]
    assert floor["total"] == floor["backbone"] + 15 * floor["depth_per_step"] + floor["codebook_heads"]
    assert measured["floor"]["floor_ms"] is None  # no bandwidth measured on the CPU
    start = measured["startup"]
    assert start["engine_build_s"] > 0 and start["warm_up_s"] > 0 and start["max_streams"] == 1
    assert start["total_s"] == pytest.approx(start["load_s"] + start["engine_build_s"] + start["warm_up_s"])
    assert start["compiled"] is False  # the CPU serves uncompiled
    fast = measured["fast_path"]
    assert fast["capacity"] == 256  # the recorded bench runs' cache; the model's own is restored after
    for key in ("cfg", "nocfg"):
        row = fast[key]
        assert row["frames"] == 4 and row["ms_per_frame"] > 0 and row["ttfa_ms"] > 0
        assert row["codec_ms_per_frame"] > 0  # the tiny model's codec decodes every frame
        assert row["floor_ratio"] is None
    precision = measured["precision"]
    by = {p["policy"]: p for p in precision["policies"]}
    assert list(by) == ["fp32", "fp16-mixed", "fp16-mixed-kv16", "fp16"] and precision["frames"] == 2
    assert precision["cfg"] is True
    assert by["fp32"]["summary"]["kl_max"] == 0.0
    assert 0.0 < by["fp16-mixed"]["summary"]["kl_mean"] < 1e-3 and by["fp16-mixed"]["summary"]["nonfinite"] == 0


def test_a_busy_gpu_is_not_measured_and_nothing_is_loaded():
    # a model directory that does not exist: loading it would raise, so returning cleanly proves nothing loaded
    measured, missing = measure(CPU, ModelSpec(model_dir="/nonexistent/model"), "bf16",
                                busy_reasons=["1 other process(es) use this GPU (pid 7; 9000 MiB)"],
                                options=MeasureOptions())
    assert measured == {} and list(missing) == list(PROBES)
    assert all(why.startswith("the GPU is busy (1 other process(es) use this GPU (pid 7; 9000 MiB))")
               and "--allow-busy" in why for why in missing.values())


def test_a_spent_budget_skips_the_long_probes_and_says_so():
    measured, missing = measure(CPU, ModelSpec(size="tiny"), "fp32", busy_reasons=[],
                                options=MeasureOptions(budget_s=1e-6))
    assert "floor" in measured  # instant, no minimum
    for probe in ("startup", "fast_path", "precision"):
        assert missing[probe].startswith("time budget spent: 0 s of --budget-s 0 left")
    assert missing["memory"] == "the worker's engine was not built (start-up not measured)"


def test_too_small_is_refused_before_loading():
    config = config_for("full")
    need = footprint.weight_bytes(config, "fp32") + footprint.codec_bytes()  # fp16-mixed loads FP32 first
    message = refuse_small(config, "fp16-mixed", 8 * 2**30)
    assert message.startswith("too small: the model under fp16-mixed and one stream need about ")
    assert f"{need / 2**30:.1f}" < message.split("about ")[1] and "8.0 GiB is free" in message
    assert refuse_small(config, "bf16", 14 * 2**30) is None  # 5.7 GB of bf16 weights fit a T4-sized card
    assert refuse_small(config, "fp16-mixed", 14 * 2**30) is None  # the 11.4 GB FP32 load fits too
    assert refuse_small(config, "bf16", None) is None  # the CPU: unknown, not refused


def test_fp16_mixed_loads_as_the_worker_loads():
    torch.set_num_threads(1)
    model, info = load_model(ModelSpec(size="tiny", seed=5), CPU, "fp16-mixed", with_codec=False)
    assert info["overflow_probe_s"] > 0 and info["kept_fp32"] == []  # random weights: nothing near 65504
    halves = [m for m in model.lm.modules() if isinstance(m, HalfLinear)]
    assert halves and all(m.weight.dtype == torch.float16 for m in halves)
    assert model.lm.lm_head.weight.dtype == torch.float32  # logits stay FP32


def _gpu_figures(tiny_measured: dict) -> dict:
    """The tiny CPU run's figures with a T4's GPU-only ones filled in as the probes would report them."""
    measured = json.loads(json.dumps(tiny_measured))
    config = config_for("full")
    total = footprint.frame_bytes(config, "fp16-mixed")
    measured["copy_bandwidth"] = {"bytes_per_s": 260e9}
    measured["floor"] = {"bytes_per_frame": {"total": total}, "floor_ms": 1000 * total / 260e9, "source": "test"}
    for key, ms in (("cfg", 55.0), ("nocfg", 50.0)):
        measured["fast_path"][key].update(ms_per_frame=ms, codec_ms_per_frame=6.0, floor_ratio=ms / (total / 260e6))
    measured["memory"] = {"capacity": 2048, "model_bytes": 7.0e9, "stream_bytes": 9.4e8, "fixed_bytes": 1.6e9,
                          "total_bytes": 15.6e9, "streams_fit": 5, "headroom_fraction": 0.1,
                          "engine_reserved_bytes": 2.0e9, "outside_bytes": 5e8}
    return measured


def test_report_of_a_cuda_run_from_recorded_shapes(tiny_run):
    measured = _gpu_figures(tiny_run[0])
    config = config_for("full")
    facts = DeviceFacts(type="cuda", name="Tesla T4", index=0, capability=(7, 5), memory_total_bytes=15_600_000_000,
                        memory_free_bytes=15_000_000_000, multiprocessors=40, emulates_bf16=True,
                        bf16_supported_with_emulation=True, versions={"python": "3.12", "torch": "2.11",
                                                                      "torch_cuda": "13.0", "triton": "3.6",
                                                                      "transformers": "5.17", "cudnn": 91000},
                        smi_error="nvidia-smi is not on PATH")
    fig = host_figures(facts, measured, "fp16-mixed", config)
    assert fig.lm_ms_cfg == 55.0 and fig.codec_ms == 6.0 and fig.bandwidth == 260e9
    assert fig.batched[0].step_ms == pytest.approx(61.0)  # one stream batched = the measured batch 1
    assert fig.projected == frozenset({"batched"})
    context = HostContext(emulates_bf16=True, startup_s=measured["startup"]["total_s"])
    doc = build(meta={"model": "random-full"}, facts=facts, policy=policy_section((7, 5), True), config=config,
                measured=measured, missing={}, subject_figures=fig, context=context, subject="this host",
                prices={}, host_price=0.526)
    json.dumps(doc)  # JSON-able as written
    v = doc["verdict"]
    assert v["rtf_batch1"] == pytest.approx(61.0 / 80) and v["streams_fit"] == 5
    assert v["stop"]["ratio"] == pytest.approx(55.0 / (1000 * measured["floor"]["bytes_per_frame"]["total"] / 260e9))
    assert v["lines"][0].startswith("RTF at batch 1 (one stream, CFG on): 0.762 (measured: LM 55.00 + codec 6.00")
    assert v["cost"]["batch1_per_audio_hour"] == pytest.approx(0.526 * 61.0 / 80)
    assert "BF16 would be emulated" in doc["policy"]["why"] and "says True here" in doc["policy"]["why"]
    report = text(doc)
    assert "clocks, driver and power not read: nvidia-smi is not on PATH" in report
    assert "fast path, batch 1, CFG on: 55.00 ms per frame" in report
    assert "memory: model 6.52 GiB, one stream slot 0.88 GiB (2048 positions)" in report
    assert "precision vs FP32 (2 teacher-forced frames, CFG on):" in report
    assert H200_REFERENCE.device in fig.source and "T4 datasheet" in fig.source


def test_the_cache_only_stepper_builds_without_graphs_or_compilation():
    """The memory probe's instrument: a stepper holding only caches (on the CPU nothing is counted as device
    memory, but it is built exactly as on a GPU)."""
    from breeze_worker.doctor.probes import _cache_only_stepper_bytes
    from breeze_worker.model.tiny import tiny_model

    torch.set_num_threads(1)
    model = tiny_model(seed=0, with_codec=False)
    assert _cache_only_stepper_bytes(model, CPU, 3) == 0
