"""The fused layer kernels on the GPU against the model's own layers, at the full-size model's widths.

- The depth decoder's layer step as the `fused+chain` kernels, and the backbone's as the `fused+chain+all`
  kernels, against the model's `DecoderLayer` (tests/gpu/layer_kernels.py): at 1 and 2 model rows (the
  served form: one stream, with and without CFG) and at 3 rows (the per-head attention kernel; rows times
  positions stay within the kernels' limit of 8), the 2-position depth prefill included. FP32: within 1e-5
  of the model (different summation orders only). BF16: no further from the model in FP32 (same rounded
  weights) than the model's own BF16 arithmetic is, with a factor 2 of slack.
- The kernels are deterministic: the same call twice gives the same bits (the split-K sums are added in split
  order, whatever order the programs finish in).
- Chained launches (programmatic dependent launch, compute capability >= 9.0) give the same bits as unchained
  ones, launched one by one and replayed from a CUDA graph.
- A depth position's logits kernel (`depth_head`) against float64 arithmetic.
"""

from __future__ import annotations

import pytest
import torch
from gpu_support import release_device_memory
from layer_kernels import (
    DEPTH_SLOTS,
    check_backbone,
    check_depth,
    check_depth_head,
    run_depth_frame,
    seeded_layers,
    stale_caches,
)

from breeze_worker.engine.fastpath import fused
from breeze_worker.model.lm.config import BreezeConfig

pytestmark = pytest.mark.gpu

FULL = BreezeConfig.full_size()
FP32_BOUND = 1e-5


@pytest.fixture(scope="module", autouse=True)
def kernels_available(cuda):
    if not fused.available(cuda):
        pytest.fail("the fused kernels are not available on this CUDA device (is Triton importable?)")
    yield
    release_device_memory()


def _assert_close(result: dict) -> None:
    assert result["finite"], result
    if result["dtype"] == "float32":
        assert result["kernels_error"] <= FP32_BOUND, result
    else:
        assert result["kernels_error"] <= 2 * result["model_error"] + 1e-3, result


FP32, BF16 = torch.float32, torch.bfloat16
# (dtype, rows): each distinct rows x positions is a kernel of its own to build, so the cases are few
DEPTH_CASES = [(FP32, 1), (FP32, 2), (FP32, 3), (BF16, 1), (BF16, 2)]
BACKBONE_CASES = [(FP32, 1), (FP32, 2), (BF16, 2)]


def _case_id(case) -> str:
    dtype, rows = case
    return f"{str(dtype).replace('torch.', '')}-{rows}rows"


@pytest.mark.parametrize("case", DEPTH_CASES, ids=_case_id)
def test_depth_layer_kernels_match_the_model(cuda, case):
    """16 positions (the 2-position prefill, then 14 single steps) over a cache of another request's entries."""
    dtype, rows = case
    layers = seeded_layers("depth", FULL.depth, 1, dtype, cuda, seed=rows)
    _assert_close(check_depth(layers, rows, positions=DEPTH_SLOTS, seed=10 + rows))


@pytest.mark.parametrize("case", BACKBONE_CASES, ids=_case_id)
def test_backbone_layer_kernels_match_the_model(cuda, case):
    """2 positions then 4 single steps, each row at its own RoPE positions and cache slots (of 64)."""
    dtype, rows = case
    layers = seeded_layers("backbone", FULL.backbone, 1, dtype, cuda, seed=20 + rows)
    _assert_close(check_backbone(layers, rows, prompt=2, steps=4, slots=64, seed=30 + rows))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_depth_head_kernel_matches_float64(cuda, dtype):
    result = check_depth_head(FULL.depth.hidden_size, FULL.vocab_size, dtype, cuda, seed=5)
    assert result["finite"] and result["shape_ok"]
    assert result["error"] <= (FP32_BOUND if dtype == torch.float32 else 1e-2), result


def _frame(layers, x, stale, graph: bool, kernels: fused.KernelSettings = fused.DEFAULT_KERNELS):
    """The 12 depth layers over a frame's 16 positions: outputs and the written caches, launched one by one
    or captured in one CUDA graph and replayed."""
    caches = [(k.clone(), v.clone()) for k, v in stale]
    workspace = fused.DownWorkspace()
    if not graph:
        out = run_depth_frame(layers, x, caches, workspace, kernels)
        return out, caches
    side = torch.cuda.Stream()  # warm up (kernels built, workspace allocated) off the capturing stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_depth_frame(layers, x, [(k.clone(), v.clone()) for k, v in stale], workspace, kernels)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph):  # captured, not run: the caches still hold the stale entries
        out = run_depth_frame(layers, x, caches, workspace, kernels)
    cuda_graph.replay()
    torch.cuda.synchronize()
    return out.clone(), caches


def test_chained_launches_give_the_same_bits(cuda):
    """Full-size depth decoder (12 layers, BF16), 2 rows (batch 1 with CFG): chained and unchained, each
    launched directly and from a CUDA graph, and a repeat: outputs and caches identical bit for bit."""
    if not fused.pdl(cuda):
        pytest.skip("chained launches need compute capability >= 9.0 and a Triton with griddepcontrol")
    layers = seeded_layers("depth", FULL.depth, FULL.depth.num_hidden_layers, torch.bfloat16, cuda, seed=7)
    generator = torch.Generator(device=cuda).manual_seed(8)
    x = torch.randn(2, DEPTH_SLOTS, FULL.depth.hidden_size, generator=generator, device=cuda).to(torch.bfloat16)
    stale = stale_caches(len(layers), 2, layers[0].packed, DEPTH_SLOTS, torch.bfloat16, cuda, seed=9)
    with torch.no_grad():
        runs = {"chained": _frame(layers, x, stale, graph=False),
                "chained_again": _frame(layers, x, stale, graph=False),
                "chained_graph": _frame(layers, x, stale, graph=True)}
        unchained = fused.KernelSettings(chained=False)
        assert not fused.pdl(cuda, unchained)
        runs["unchained"] = _frame(layers, x, stale, graph=False, kernels=unchained)
        runs["unchained_graph"] = _frame(layers, x, stale, graph=True, kernels=unchained)
    out, caches = runs["chained"]
    assert bool(torch.isfinite(out).all())
    for name, (other_out, other_caches) in runs.items():
        assert torch.equal(out, other_out), name
        assert all(torch.equal(a, b) for pair, other in zip(caches, other_caches) for a, b in zip(pair, other)), name
