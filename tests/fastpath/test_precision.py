"""The precision policy: the capability table, the refusal of emulated BF16, and the fp16-mixed recipe
against a massive activation (plain FP16 overflows, fp16-mixed stays finite and close to FP32)."""

from __future__ import annotations

import copy

import pytest
import torch

from breeze_worker.engine.precision import (
    HalfLinear,
    UnsupportedPrecision,
    apply_policy,
    codec_tf32_wanted,
    find_overflowing_layers,
    make_policy,
    policy_for_capability,
    resolve_policy,
)
from breeze_worker.measure.agreement import first_frame_logits
from breeze_worker.model.tiny import tiny_model


@pytest.mark.parametrize("capability, expected", [
    (None, "fp32"), ((7, 5), "fp16-mixed"), ((7, 0), "fp16-mixed"), ((6, 1), "fp16-mixed"),
    ((8, 0), "bf16"), ((8, 9), "bf16"), ((9, 0), "bf16"),
])
def test_auto_table(capability, expected):
    assert policy_for_capability(capability) == expected
    policy = resolve_policy("auto", capability)
    assert policy.name == expected
    assert policy.gemm_dtype == {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16-mixed": torch.float16}[expected]


def test_bf16_refused_without_native_support_unless_forced():
    with pytest.raises(UnsupportedPrecision, match="no native BF16.*fp16-mixed"):
        resolve_policy("bf16", (7, 5))
    assert resolve_policy("bf16", (7, 5), force=True).name == "bf16"
    assert resolve_policy("bf16", (8, 0)).name == "bf16"
    assert resolve_policy("fp16-mixed", (9, 0)).weight_dtype == torch.float32  # loads FP32, converts GEMMs
    with pytest.raises(ValueError, match="precision must be"):
        resolve_policy("fp8", (9, 0))


@pytest.mark.parametrize("capability, asked, expected", [
    ((9, 0), False, False), ((9, 0), True, True), ((8, 0), True, True), ((8, 6), False, False),
    ((7, 5), True, False), ((7, 0), True, False), (None, True, False),
])
def test_codec_convolutions_are_fp32_unless_tf32_is_asked_for_and_exists(capability, asked, expected):
    assert codec_tf32_wanted(capability, asked) is expected


def test_codec_tf32_setting_comes_from_the_worker_settings():
    from breeze_worker.config import WorkerSettings
    from breeze_worker.engine.runtime import configure_codec_convolutions

    assert WorkerSettings.from_env({}).engine.codec_tf32 is True  # PyTorch's own default for cuDNN
    assert WorkerSettings.from_env({"BREEZE_ENGINE_CODEC_TF32": "0"}).engine.codec_tf32 is False
    with pytest.raises(ValueError, match=r"BREEZE_ENGINE_CODEC_TF32='maybe' \(--codec-tf32\): 'maybe' is not a switch"):
        WorkerSettings.from_env({"BREEZE_ENGINE_CODEC_TF32": "maybe"})
    assert configure_codec_convolutions(torch.device("cpu"), True) is False  # the CPU has no cuDNN convolutions


def test_half_precision_on_cpu_needs_force():
    with pytest.raises(UnsupportedPrecision):
        resolve_policy("fp16-mixed", None)
    assert resolve_policy("fp16-mixed", None, force=True).name == "fp16-mixed"


def _massive(request_for):
    """A tiny model whose first backbone MLP produces a ~1e5 activation (above FP16's 65504)."""
    model = tiny_model(seed=0, with_codec=False)
    mlp = model.lm.backbone_model.layers[0].mlp
    with torch.no_grad():
        mlp.gate_proj.weight.mul_(1500.0)
        mlp.up_proj.weight.mul_(1500.0)
    return model, request_for(model, False, frames=2)


def test_massive_activation_fp16_overflows_fp16_mixed_does_not(request_for):
    torch.set_num_threads(1)
    model, request = _massive(request_for)
    ref0, ref1 = first_frame_logits(model, request)
    assert torch.isfinite(ref0).all()

    plain = copy.copy(model)
    plain.lm = copy.deepcopy(model.lm).half()
    plain0, _ = first_frame_logits(plain, request)
    assert not torch.isfinite(plain0).all()  # the overflow reaches the logits

    keep = find_overflowing_layers(model.lm, lambda: first_frame_logits(model, request))
    assert "backbone_model.layers.0.mlp.down_proj" in keep
    mixed = copy.copy(model)
    mixed.lm = copy.deepcopy(model.lm)
    converted = apply_policy(mixed.lm, make_policy("fp16-mixed", "test"), keep)
    assert "backbone_model.layers.0.mlp.down_proj" not in converted
    assert isinstance(mixed.lm.backbone_model.layers[1].mlp.down_proj, HalfLinear)
    assert mixed.lm.backbone_model.layers[1].mlp.down_proj.weight.dtype == torch.float16
    assert mixed.lm.lm_head.weight.dtype == torch.float32  # logits in FP32
    assert mixed.lm.backbone_model.norm.weight.dtype == torch.float32  # norms in FP32
    got0, got1 = first_frame_logits(mixed, request)
    assert torch.isfinite(got0).all() and torch.isfinite(got1).all()
    assert float((got0 - ref0).norm() / ref0.norm()) < 1e-2
    assert float((got1 - ref1).norm() / ref1.norm()) < 1e-2
