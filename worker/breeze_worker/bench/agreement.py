"""Precision agreement: a half-precision policy against FP32 on the same weights, teacher-forced.

Runs the backbone prefill of one prompt and the depth decoder's first position pair with the model's own
blocks (the eager code), and compares the codebook-0 and codebook-1 logits: relative L2 error, whether all
are finite, and whether the arg-max agrees.
"""

from __future__ import annotations

import copy

import torch

from breeze_worker.engine.precision import apply_policy, find_overflowing_layers, make_policy
from breeze_worker.engine.prompt import prepare_prompt_embeddings
from breeze_worker.model.lm.layers import additive_mask
from breeze_worker.model.loaded import LoadedModel


@torch.no_grad()
def first_frame_logits(model: LoadedModel, request) -> tuple[torch.Tensor, torch.Tensor]:
    """(codebook-0 logits [R, V+1], codebook-1 logits [R, V]) of the first frame, codebook 0 forced to 0."""
    lm = model.lm
    prompt = prepare_prompt_embeddings(model, request)
    length = prompt.length
    device = prompt.inputs_embeds.device
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    allowed = causal[None, None] & prompt.attention_mask[:, None, None, :]
    dtype = prompt.inputs_embeds.dtype
    hidden = lm.backbone(prompt.inputs_embeds, prompt.positions, additive_mask(allowed, dtype),
                         lm.new_backbone_cache())[:, -1]
    logits0 = lm.backbone_logits(hidden)
    rows = hidden.shape[0]
    inputs = lm.depth_prefill_inputs(hidden, torch.zeros(rows, dtype=torch.int64, device=device))
    mask = additive_mask(torch.ones(2, 2, dtype=torch.bool, device=device).tril()[None, None], inputs.dtype)
    depth_hidden = lm.depth_decoder(inputs, torch.arange(2, device=device), mask, lm.new_depth_cache())[:, -1]
    return logits0.float(), lm.depth_logits(depth_hidden, 1).float()


def _compare(test: torch.Tensor, ref: torch.Tensor) -> dict:
    finite = bool(torch.isfinite(test).all())
    rel = float((test - ref).norm() / ref.norm()) if finite else float("inf")
    return {"finite": finite, "rel_error": rel,
            "argmax_agree": bool(finite and torch.equal(test.argmax(-1), ref.argmax(-1)))}


def precision_agreement(fp32_model: LoadedModel, request, policy_name: str, find_overflow: bool = True) -> dict:
    """Copy the FP32 model, apply `policy_name` (fp16-mixed: with the overflow finder run on the FP32
    reference first), and compare first-frame logits against FP32."""
    ref0, ref1 = first_frame_logits(fp32_model, request)
    keep = {}
    if policy_name == "fp16-mixed" and find_overflow:
        keep = find_overflowing_layers(fp32_model.lm, lambda: first_frame_logits(fp32_model, request))
    test_model = copy.copy(fp32_model)
    test_model.lm = copy.deepcopy(fp32_model.lm)
    for stale in ("_fastpath_packed", "backbone_logits", "_bench_eos_masked"):  # per-instance state, not weights
        test_model.lm.__dict__.pop(stale, None)
    apply_policy(test_model.lm, make_policy(policy_name, "agreement check"), keep)
    got0, got1 = first_frame_logits(test_model, request)
    return {"policy": policy_name, "kept_fp32": sorted(keep), "codebook0": _compare(got0, ref0),
            "codebook1": _compare(got1, ref1)}
