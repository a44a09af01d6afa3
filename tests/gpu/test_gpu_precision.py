"""The bf16 and fp16-mixed fast paths against the FP32 eager path on the full-size model.

Measured by tests/gpu/policy_agreement.py (its docstring says what each figure is) on the full-size
architecture with seeded random weights, CFG on, 12 greedy frames and 200 sampling seeds; the figures go to
$BREEZE_GPU_FIGURES/precision_agreement.json (docs/performance.md reports them). What must hold:

- everything finite: no non-finite logit, every request ends at its frame limit (a non-finite frame would
  end it with an error);
- FP32: the fast path's greedy frames are the eager path's, code for code, and its sampled codebook-0 codes
  are FP32's exact draws for the same seeds' noise; their spread around the exact filtered softmax is no
  more than sampling alone gives (the 99.9% quantile of as many exact draws);
- bf16 / fp16-mixed, above floors set well below what these policies measure and far above what a broken path
  gives. Random weights make the logits nearly flat (no trained margins), the hardest case for agreement:
  - teacher-forced arg-max agreement >= 0.6 / 0.9 (`breeze-worker precision-check` measured 0.875 / 1.0 over
    8 frames x 16 codebooks of this model in 2026-11; unrelated logits agree ~1/2000);
  - teacher-forced KL(p_fp32 || p_policy) mean <= 2e-2 / 1e-3 (the precision check measured 2.3e-3 / 1.9e-5);
  - the same sampled code as FP32 for the same seed's noise >= 0.8 / 0.95: in the exponential race the gap
    between the two best keys is about Exp(1)-distributed, so a logit error of size e flips a draw with a
    probability of about e; bf16 errs by ~1e-2 of the logits' spread, fp16-mixed by ~1e-3 (the precision
    check's relative errors); independent draws from 50 kept classes agree ~1/50.
"""

from __future__ import annotations

import pytest
import torch
from gpu_support import release_device_memory
from policy_agreement import measure

pytestmark = pytest.mark.gpu

FLOORS = {  # policy: (teacher-forced arg-max agreement, KL mean bound, same sampled code as FP32)
    "bf16": (0.6, 2e-2, 0.8),
    "fp16-mixed": (0.9, 1e-3, 0.95),
}


@pytest.mark.timeout(900)
def test_precision_agreement(cuda, write_figures):
    try:
        doc = measure("full", cuda, policies=tuple(FLOORS), frames=12, seeds=200)
    finally:
        release_device_memory()
    doc["device"] = torch.cuda.get_device_name(cuda)
    write_figures("precision_agreement", doc)
    fp32 = doc["fp32_fast_vs_eager"]
    assert fp32["greedy"]["identical"], fp32["greedy"]
    assert fp32["same_code_as_exact_draw"] == 1.0, fp32
    assert fp32["tv_to_exact"] <= doc["tv_sampling_noise"]["q999"], (fp32, doc["tv_sampling_noise"])
    for name, (argmax_floor, kl_bound, same_floor) in FLOORS.items():
        result = doc["policies"][name]
        forced = result["teacher_forced"]
        assert forced["nonfinite_logits"] == 0, (name, forced)
        assert forced["argmax_agreement"] >= argmax_floor, (name, forced)
        assert forced["kl_mean"] is not None and forced["kl_mean"] <= kl_bound, (name, forced)
        assert result["same_code_as_fp32"] >= same_floor, (name, result)
