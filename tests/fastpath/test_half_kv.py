"""The backbone's keys and values in FP16 beside fp16-mixed's FP32 residual stream (FastPathSettings.half_kv,
engine/precision.py `backbone_kv_dtype`), on the CPU:

- allowed or refused from the weights alone: refused without q/k norms, where the start-up probe kept a q/k/v
  projection in FP32, where the norm gains let keys or scores near FP16's limit, and beside a 16-bit residual;
- attention over an FP16 cache beside FP32 queries (both of the fast path's forms: GEMMs in the cache's dtype,
  FP32 reductions) against the same attention in float64 with numpy, from the stored FP16 values;
- a slot's backbone cache takes half the bytes, and the batched engine's frames are the FP32 cache's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.batching import BatchedStepper
from breeze_worker.engine.fastpath.layers import attend
from breeze_worker.engine.precision import apply_policy, backbone_kv_dtype, half_kv_refusal, make_policy
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import SynthesisRequest
from breeze_worker.model.tiny import tiny_model


def _mixed(keep=()):
    model = tiny_model(seed=0, with_codec=False)
    apply_policy(model.lm, make_policy("fp16-mixed", "test"), keep)
    return model


@pytest.fixture(scope="module")
def mixed():
    torch.set_num_threads(1)
    return _mixed()


def test_allowed_from_the_weights_and_refused_where_they_do_not_bound_the_cache(mixed):
    assert half_kv_refusal(mixed.lm) is None
    assert backbone_kv_dtype(mixed.lm, True) == torch.float16
    assert backbone_kv_dtype(mixed.lm, False) == torch.float32  # the setting turns it off
    fp32 = tiny_model(seed=0, with_codec=False)
    assert "does not run in FP16" in half_kv_refusal(fp32.lm)  # fp32 policy: nothing in FP16
    bf16 = tiny_model(seed=0, with_codec=False)
    apply_policy(bf16.lm, make_policy("bf16", "test"))
    assert "residual stream is torch.bfloat16" in half_kv_refusal(bf16.lm)
    assert backbone_kv_dtype(bf16.lm, True) == torch.bfloat16
    kept = _mixed(keep=("backbone_model.layers.1.self_attn.v_proj",))  # the probe kept it: values may not fit
    assert "layer 1's v_proj does not run in FP16" in half_kv_refusal(kept.lm)
    assert backbone_kv_dtype(kept.lm, True) == torch.float32
    loud = _mixed()
    with torch.no_grad():
        loud.lm.backbone_model.layers[0].self_attn.k_norm.weight.mul_(1e4)
    assert "within 4x of FP16's limit" in half_kv_refusal(loud.lm)
    plain = _mixed()
    plain.lm.backbone_model.layers[0].self_attn.k_norm = None
    assert "no q/k norm" in half_kv_refusal(plain.lm)


def _numpy_attention(q, keys, values, mask, scale):
    """Grouped-query attention in float64 from the given (already stored) tensors."""
    q, k, v, m = (t.double().numpy() for t in (q, keys, values, mask))
    rows, heads, t, d = q.shape
    kv = k.shape[1]
    out = np.zeros((rows, heads, t, d))
    for h in range(heads):
        scores = q[:, h] @ k[:, h // (heads // kv)].transpose(0, 2, 1) * scale + m[:, 0]
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        out[:, h] = (probs / probs.sum(-1, keepdims=True)) @ v[:, h // (heads // kv)]
    return out


@pytest.mark.parametrize("reduce", [False, True], ids=["gemm", "reductions"])
def test_attention_over_an_fp16_cache_beside_fp32_queries(reduce):
    gen = torch.Generator().manual_seed(3)
    rows, heads, kv, t, length, d = 3, 8, 2, 1, 40, 64
    q = torch.randn(rows, heads, t, d, generator=gen) * 2  # about what a q/k-normed head holds
    keys = (torch.randn(rows, kv, length, d, generator=gen) * 2).half()
    values = (torch.randn(rows, kv, length, d, generator=gen) * 30).half()
    allowed = torch.rand(rows, 1, t, length, generator=gen) > 0.3
    allowed[..., 0] = True
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    got = attend(q, keys, values, mask, d ** -0.5, reduce=reduce)
    assert got.dtype == torch.float32 and got.shape == (rows, heads, t, d)
    want = _numpy_attention(q, keys, values, mask, d ** -0.5)
    # both round the probabilities and the output to the values' FP16 (11 significant bits; values ~30 here),
    # the GEMM form the scaled query and the scores too; a wrong head grouping, scale or mask is off by whole units
    error = np.abs(got.double().numpy() - want)
    assert error.max() < 0.25 and error.mean() < 2e-3 * np.abs(want).mean()


def _request(model, text: str, cfg: bool, seed: int, frames: int):
    req = SynthesisRequest(text=text, instruction="calm and slow" if cfg else None, cfg_scale=2.0 if cfg else None,
                           seed=seed, max_frames=frames)
    return resolve_request(req, model.generation_defaults, None, tokenizer=model.tokenizer)


def _frames(model, half_kv: bool) -> tuple[dict, BatchedStepper]:
    stepper = BatchedStepper(model, 2, "cpu", settings=FastPathSettings(half_kv=half_kv))
    assert stepper.join([("a", _request(model, "hello there", True, 1, 10)),
                         ("b", _request(model, "a somewhat longer one", False, 2, 10))]) == {}
    frames: dict[str, list] = {}
    for _ in range(12):
        for key, out in stepper.step().items():
            assert out.error is None
            if out.frame is not None:
                frames.setdefault(key, []).append(out.frame)
    return frames, stepper


def test_a_slot_takes_half_the_backbone_bytes_and_the_frames_are_the_fp32_caches(mixed):
    full, full_stepper = _frames(mixed, half_kv=False)
    half, half_stepper = _frames(mixed, half_kv=True)
    big, small = full_stepper.step_buffers.cache, half_stepper.step_buffers.cache
    assert big.key.dtype == torch.float32 and small.key.dtype == torch.float16
    assert small.key.nbytes * 2 == big.key.nbytes and small.value.nbytes * 2 == big.value.nbytes
    assert half_stepper.step_buffers.depth_cache.key.dtype == torch.float32  # 16 positions a row: not worth it
    for key in ("a", "b"):
        assert len(half[key]) == len(full[key]) == 10
        assert all(torch.equal(x, y) for x, y in zip(half[key], full[key])), key
