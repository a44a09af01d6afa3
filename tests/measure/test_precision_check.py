"""`breeze-worker precision-check`: teacher forcing reproduces the eager loop, FP32 against itself is exactly
zero, fp16-mixed differs by a small, finite amount, and the JSON has the documented shape."""

from __future__ import annotations

import dataclasses
import json
import math

import torch

from breeze_worker.cli import main as worker_main
from breeze_worker.engine.types import SamplingParams
from breeze_worker.measure.agreement import precision_check, teacher_codes, teacher_forced_logits
from breeze_worker.measure.setup import make_request

SUMMARY_KEYS = {"kl_mean", "kl_max", "top1_agreement", "topk_overlap", "nonfinite", "steps_with_nonfinite"}


def test_teacher_forcing_reproduces_greedy_eager_frames(tiny_lm):
    for cfg in (False, True):
        request = make_request(tiny_lm, "hello there world", cfg, 4, 3)
        greedy = dataclasses.replace(request, sampling=SamplingParams(temperature=0.0, top_k=0, top_p=1.0,
                                                                      repetition_penalty=1.0))
        codes = teacher_codes(tiny_lm, greedy)
        logits0, depth = teacher_forced_logits(tiny_lm, greedy, codes)
        assert logits0.shape == (4, 2052) and depth.shape == (4, 15, 2051)
        reserved = list(tiny_lm.config.reserved_code_ids)
        logits0[:, reserved + [tiny_lm.config.end_of_speech_id]] = float("-inf")
        depth[..., reserved] = float("-inf")
        predicted = torch.cat((logits0.argmax(-1)[:, None], depth.argmax(-1)), dim=1)
        assert torch.equal(predicted, codes)
    assert "backbone_logits" not in tiny_lm.lm.__dict__  # the end-of-speech mask was removed again


def test_fp32_is_exactly_zero_and_fp16_mixed_small_and_finite(tiny_lm):
    request = make_request(tiny_lm, "hello there world", False, 3, 5)
    result = precision_check(tiny_lm, request, ["fp32", "fp16-mixed"])
    by = {p["policy"]: p for p in result["policies"]}
    fp32, mixed = by["fp32"]["summary"], by["fp16-mixed"]["summary"]
    assert fp32["kl_mean"] == 0.0 and fp32["kl_max"] == 0.0 and fp32["top1_agreement"] == 1.0
    assert fp32["topk_overlap"] == 1.0 and fp32["nonfinite"] == 0
    assert by["fp16-mixed"]["applied"] and not by["fp16-mixed"]["emulated"]  # FP16 GEMMs run on this CPU
    assert 0.0 < mixed["kl_mean"] < 1e-3 and math.isfinite(mixed["kl_max"]) and mixed["nonfinite"] == 0
    assert mixed["top1_agreement"] > 0.9
    assert len(by["fp16-mixed"]["per_step"]) == 3 and len(by["fp16-mixed"]["per_codebook"]) == 16


def test_plain_fp16_overflow_is_counted_where_fp16_mixed_stays_finite(tiny_lm):
    """A weight scaled to create a massive activation: plain FP16 gives non-finite logits, and fp16-mixed keeps
    the flagged layer in FP32 and stays finite."""
    import copy

    model = copy.copy(tiny_lm)
    model.lm = copy.deepcopy(tiny_lm.lm)
    mlp = model.lm.backbone_model.layers[0].mlp
    with torch.no_grad():  # a ~1e5 activation, above FP16's 65504
        mlp.gate_proj.weight.mul_(1500.0)
        mlp.up_proj.weight.mul_(1500.0)
    request = make_request(model, "hello there world", False, 2, 5)
    by = {p["policy"]: p for p in precision_check(model, request, ["fp16-mixed", "fp16"])["policies"]}
    assert by["fp16"]["summary"]["nonfinite"] > 0 and by["fp16"]["summary"]["steps_with_nonfinite"] > 0
    assert by["fp16-mixed"]["summary"]["nonfinite"] == 0
    assert "backbone_model.layers.0.mlp.down_proj" in by["fp16-mixed"]["kept_fp32"]


def test_cli_json_schema(tmp_path, tiny_lm, monkeypatch):
    monkeypatch.setattr("breeze_worker.measure.setup.load_model", lambda args, device, precision=None: tiny_lm)
    out = tmp_path / "precision.json"
    assert worker_main(["precision-check", "--device", "cpu", "--frames", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "breeze-precision-check/1" and doc["frames"] == 2 and doc["top_k"] == 50
    assert {"device", "model", "reference", "cfg", "seed", "teacher"} <= set(doc["meta"])
    assert [p["policy"] for p in doc["policies"]] == ["fp32", "bf16", "fp16-mixed", "fp16-mixed-kv16", "fp16"]
    ranges = doc["kv_ranges"]  # reported with the kv16 policy
    assert len(ranges["per_layer"]) == 2 and ranges["fp16_limit"] == 65504.0
    for p in doc["policies"]:
        assert {"policy", "applied", "emulated", "note", "kept_fp32", "recipe", "error", "summary", "per_step",
                "per_codebook"} <= set(p)
        assert set(p["summary"]) == SUMMARY_KEYS
        assert [s["frame"] for s in p["per_step"]] == [0, 1]
        assert all(SUMMARY_KEYS <= set(s) for s in p["per_step"])
    assert "refuses" in doc["policies"][2]["note"]  # half precision on the CPU: the worker would refuse it


def test_policy_models_are_built_from_the_host_copy_one_at_a_time(tiny_lm, monkeypatch):
    """The device never holds two models: every policy model is a fresh copy of the (host) FP32 model, and the
    previous policy's model is gone before the next one is built; the FP32 weights are never converted."""
    import gc
    import weakref

    from breeze_worker.measure import agreement

    built: list[weakref.ref] = []
    original = agreement.policy_model
    fp32_weights = {n: p.detach().clone() for n, p in tiny_lm.lm.named_parameters()}

    def tracked(fp32, name, keep, device=None):
        gc.collect()
        assert all(ref() is None for ref in built), "a previous policy model is still alive"
        assert fp32.lm is tiny_lm.lm and fp32.device.type == "cpu"  # built from the FP32 model on the host
        model, recipe = original(fp32, name, keep, device)
        assert model.lm is not fp32.lm and model.device == device
        built.append(weakref.ref(model.lm))
        return model, recipe

    monkeypatch.setattr(agreement, "policy_model", tracked)
    request = make_request(tiny_lm, "hello there world", False, 2, 5)
    result = precision_check(tiny_lm, request, ["fp32", "fp16-mixed", "fp16"])
    assert [p["policy"] for p in result["policies"]] == ["fp32", "fp16-mixed", "fp16"] and len(built) == 3
    gc.collect()
    assert all(ref() is None for ref in built)
    assert all(p.dtype == torch.float32 and torch.equal(p, fp32_weights[n]) for n, p in tiny_lm.lm.named_parameters())
    assert result["policies"][0]["summary"]["kl_max"] == 0.0  # the reference itself is untouched


def test_move_to_host_leaves_a_cpu_model_where_it_is(tiny_lm):
    from breeze_worker.measure.agreement import move_to_host

    weight = tiny_lm.lm.lm_head.weight
    assert move_to_host(tiny_lm) == torch.device("cpu") and tiny_lm.lm.lm_head.weight is weight


def test_cli_massive_activation_shows_where_plain_fp16_overflows(tmp_path, monkeypatch, capsys):
    """--massive-activation: plain FP16 turns every logit non-finite, fp16-mixed keeps the layer the FP32
    reference flags (its input ~1.8e5, past FP16's 65504) in FP32 and stays finite; both are recorded."""
    from breeze_worker.model.tiny import tiny_model

    model = tiny_model(seed=0, with_codec=False)  # changed in place by the stress: not the shared fixture
    monkeypatch.setattr("breeze_worker.measure.setup.load_model", lambda args, device, precision=None: model)
    out = tmp_path / "stress.json"
    assert worker_main(["precision-check", "--device", "cpu", "--frames", "2", "--policies", "fp16-mixed,fp16",
                        "--massive-activation", "1000", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["massive_activation"] == {"scale": 1000.0, "scaled": [
        "backbone_model.layers.0.mlp.gate_proj.weight", "backbone_model.layers.0.mlp.up_proj.weight"]}
    peaks = doc["activation_peaks"]
    assert list(peaks) == ["backbone_model.layers.0.mlp.down_proj"] and peaks[list(peaks)[0]] > 65504
    mixed, plain = doc["policies"]
    assert mixed["kept_fp32"] == ["backbone_model.layers.0.mlp.down_proj"] and mixed["summary"]["nonfinite"] == 0
    assert mixed["summary"]["kl_max"] < 1e-4
    assert plain["summary"]["steps_with_nonfinite"] == 2 * 16 and plain["summary"]["kl_mean"] is None
    printed = capsys.readouterr().out
    assert printed.startswith("stress test: backbone_model.layers.0.mlp.gate_proj.weight")
    assert "within 4x of the FP16 limit (65504): backbone_model.layers.0.mlp.down_proj (1.8" in printed


def test_cli_massive_activation_must_be_positive(capsys):
    assert worker_main(["precision-check", "--device", "cpu", "--massive-activation", "0"]) == 2
    assert "--massive-activation must be positive" in capsys.readouterr().err


def test_kv16_stores_the_backbone_cache_in_fp16_and_the_keys_stay_under_their_norm_bound(tiny_lm):
    """fp16-mixed-kv16 rounds every backbone key and value to FP16 (model/lm/layers.py RoundingKVCache) and
    agrees with FP32 about as well as fp16-mixed; the FP32 reference's largest key per layer is under the bound
    the q/k norm puts on it (sqrt(head_dim) x the largest k-norm gain), a bound derived, not fitted."""
    request = make_request(tiny_lm, "hello there world", True, 3, 5)
    result = precision_check(tiny_lm, request, ["fp16-mixed", "fp16-mixed-kv16"])
    by = {p["policy"]: p for p in result["policies"]}
    kv16 = by["fp16-mixed-kv16"]
    assert kv16["applied"] and not kv16["emulated"] and "stored in FP16" in kv16["recipe"]
    assert kv16["summary"]["nonfinite"] == 0 and kv16["summary"]["top1_agreement"] >= 0.95
    assert kv16["summary"]["kl_mean"] < 10 * by["fp16-mixed"]["summary"]["kl_mean"] + 1e-6
    ranges = result["kv_ranges"]
    for layer in ranges["per_layer"]:
        assert 0.0 < layer["key_max"] <= layer["key_bound"] and layer["value_max"] > 0.0
    assert ranges["key_max"] < 65504.0 and ranges["value_max"] < 65504.0


def test_cli_codec_check(tmp_path, monkeypatch, capsys):
    """`precision-check --codec` decodes the teacher frames with the codec in FP32 and fp16-mixed, both ways."""
    from breeze_worker.model.tiny import tiny_model

    model = tiny_model(seed=0)  # with its codec
    monkeypatch.setattr("breeze_worker.measure.setup.load_model", lambda args, device, precision=None: model)
    out = tmp_path / "precision.json"
    assert worker_main(["precision-check", "--device", "cpu", "--frames", "3", "--policies", "fp16-mixed",
                        "--codec", "--json", str(out)]) == 0
    codec = json.loads(out.read_text())["codec"]
    assert codec["frames"] == 3 and codec["rows"] == 1 and codec["threshold_db"] == 40.0
    assert codec["passes"] and codec["min_snr_db"] >= 40.0
    assert "codec fp16-mixed vs fp32 (3 frames" in capsys.readouterr().out
    assert model.codec.precision == "fp32"  # the check decodes with a copy
    no_codec = tiny_model(seed=0, with_codec=False)
    monkeypatch.setattr("breeze_worker.measure.setup.load_model", lambda args, device, precision=None: no_codec)
    assert worker_main(["precision-check", "--device", "cpu", "--frames", "2", "--codec"]) == 2
