"""The GPU suite's checks, run on the CPU (no `gpu` mark: the CPU suite runs these): the same code paths on
the tiny model, so that a mistake in a check fails here and not after a device call.

- tests/gpu/layer_kernels.py's compositions of the fused kernels run their torch stages on the CPU: against
  the model's own layers they agree within the GPU test's bounds (FP32: rounding; BF16: as close as the
  model's own BF16 arithmetic), and a layer given another layer's weights is far outside them;
- the sampler-escape count of tests/gpu/test_gpu_sampling.py over a few thousand draws (sorted and pairwise);
- tests/gpu/policy_agreement.py on the tiny model: FP32 fast == FP32 eager, greedy and sampled, every figure
  present and finite.
"""

from __future__ import annotations

import math

import pytest
import torch
from layer_kernels import check_backbone, check_depth, check_depth_head, seeded_layers
from policy_agreement import measure
from test_gpu_sampling import escaped_draws

from breeze_worker.model.lm.config import BreezeConfig

CPU = torch.device("cpu")
TINY = BreezeConfig.tiny()


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_compositions_match_the_model_on_the_cpu(dtype):
    depth = seeded_layers("depth", TINY.depth, 2, dtype, CPU, seed=0)
    backbone = seeded_layers("backbone", TINY.backbone, 1, dtype, CPU, seed=1)
    results = [check_depth(depth, rows, 16, seed=rows) for rows in (1, 2, 3)]
    results += [check_backbone(backbone, rows, prompt=2, steps=4, slots=16, seed=rows) for rows in (1, 2)]
    for result in results:
        assert result["finite"], result
        if dtype == torch.float32:
            assert result["kernels_error"] <= 1e-5, result  # the GPU test's bound
        else:
            assert result["model_error"] > 0, result  # BF16 rounding shows
            assert result["kernels_error"] <= 2 * result["model_error"] + 1e-3, result
    head = check_depth_head(TINY.depth.hidden_size, TINY.vocab_size, dtype, CPU, seed=2)
    assert head["finite"] and head["shape_ok"] and head["error"] <= 1e-5, head


def test_a_wrong_layer_is_caught():
    """The comparison is sharp: a layer whose kernels see another layer's weights is far off."""
    a = seeded_layers("depth", TINY.depth, 1, torch.float32, CPU, seed=0)
    b = seeded_layers("depth", TINY.depth, 1, torch.float32, CPU, seed=1)
    mixed = [type(a[0])(a[0].module, b[0].packed, a[0].rotary)]
    assert check_depth(mixed, 2, 16, seed=3)["kernels_error"] > 0.5


@pytest.mark.parametrize("sampler", ["sorted", "pairwise"])
@pytest.mark.parametrize("extreme", [False, True], ids=["noise", "extreme-noise"])
def test_sampler_escape_count_on_the_cpu(sampler, extreme):
    """A few draws (the pairwise filter's V x V comparisons are slow on the CPU; tests/engine/
    test_sampling_fidelity.py counts many more through the torch sampler)."""
    streams, positions = (40, 32) if sampler == "sorted" else (2, 3)
    draws, escaped = escaped_draws(CPU, sampler, extreme, streams=streams, positions=positions, chunk=streams)
    assert draws == streams * positions and escaped == 0


def test_policy_agreement_on_the_tiny_model():
    doc = measure("tiny", CPU, policies=("bf16", "fp16-mixed"), frames=3, seeds=12)
    fp32 = doc["fp32_fast_vs_eager"]
    assert fp32["greedy"]["identical"] and fp32["greedy"]["codes_equal_before_divergence"] == 3 * 16
    assert fp32["same_code_as_exact_draw"] == 1.0
    assert doc["kept_classes"] == 50  # top-k 50 of codebook 0's classes
    noise = doc["tv_sampling_noise"]
    assert 0 < noise["median"] <= noise["q99"] <= noise["q999"] <= 1
    assert set(doc["policies"]) == {"bf16", "fp16-mixed"}
    for result in doc["policies"].values():
        forced = result["teacher_forced"]
        assert forced["nonfinite_logits"] == 0 and len(forced["argmax_agreement_per_codebook"]) == 16
        assert 0 <= forced["argmax_agreement"] <= 1 and math.isfinite(forced["kl_mean"])
        assert 0 <= result["same_code_as_fp32"] <= 1 and 0 <= result["tv_to_exact"] <= 1
        greedy = result["greedy"]
        assert greedy["frames"] == 3 and len(greedy["per_codebook_agreement_all_frames"]) == 16
