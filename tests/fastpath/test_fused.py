"""The fused kernels themselves (engine/fastpath/fused.py), run by Triton's interpreter on the CPU, give what
their torch stages give (tests/fastpath/fused_interpreter_check.py: FP32 to ~1e-6, FP16 bit for bit or
nearly, odd row counts, both depth step lengths, K split into 1-12 chunks). The interpreter must be chosen
before Triton is imported, hence the subprocess; Triton is a dev dependency (pyproject.toml)."""

from __future__ import annotations

import pytest


def test_fused_kernels_match_their_torch_stages_in_the_interpreter(interpreter_check):
    cases = interpreter_check("fused_interpreter_check.py")
    assert len(cases) == 7 and all(c["ok"] for c in cases)
    fp32 = [c for c in cases if c["dtype"] == c["weights"] == "torch.float32"]
    assert len(fp32) == 4 and max(max(c[k] for k in ("q", "k_cache", "attention", "o_residual", "out", "norm_linear",
                                                     "backbone_q", "backbone_k_cache", "backbone_v_cache"))
                                  for c in fp32) < 1e-5
    assert {c["down_splits"] for c in cases} >= {3, 6, 12}  # the ordered split-K sum at several splits
    assert {c["o_splits"] for c in cases} >= {1, 2}  # the output projection: one chunk, and split
    assert all(c["workspace_reused_identical"] for c in cases)  # counters reset by the last arrival
    # fp16-mixed's backbone cache in FP16 beside FP32 activations: keys and values rounded once into it
    assert any(c["dtype"] == "torch.float32" and c["backbone_cache"] == "torch.float16" for c in cases)


def test_depth_head_kernel_matches_its_torch_form_in_the_interpreter(interpreter_check):
    """fused.depth_head (final norm, the codebook's head in FP32, CFG): CFG and plain streams, strided rows, and
    streams with two guidance scales (a third row) beside them."""
    cases = interpreter_check("head_interpreter_check.py")
    assert len(cases) == 6 and all(c["ok"] for c in cases)
    assert any(c["strided"] for c in cases) and any(c["no_cfg_streams"] and c["cfg_streams"] for c in cases)
    assert any(c["dual_streams"] and c["no_cfg_streams"] and c["cfg_streams"] > c["dual_streams"] for c in cases)
    assert max(c["err"] for c in cases if c["dtype"] == c["weights"] == "torch.float32") < 1e-5


def test_depth_head_kernel_compiles_for_hopper():
    """Triton's compiler (stricter than its interpreter) builds the depth head kernel for sm_90, its third-row
    branch (two guidance scales) included, at the full-size depth width and a batch of streams."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from breeze_worker.engine.fastpath import fused_kernels

    signature = {"x_ptr": "*bf16", "stride_x": "i32", "w_norm_ptr": "*bf16", "w_ptr": "*bf16", "cond_ptr": "*i64",
                 "uncond_ptr": "*i64", "scale_ptr": "*fp32", "ref_ptr": "*i64", "ref_scale_ptr": "*fp32",
                 "out_ptr": "*fp32", "H": "i32", "V": "i32", "eps": "fp32", "STREAMS": "constexpr",
                 "BLOCK_V": "constexpr", "HP": "constexpr", "USE_PDL": "constexpr"}
    source = ASTSource(fn=fused_kernels._depth_head_kernel, signature=signature,
                       constexprs={"STREAMS": 4, "BLOCK_V": 8, "HP": 1024, "USE_PDL": True})
    built = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    assert "_depth_head_kernel" in built.asm["ptx"] and len(built.asm["cubin"]) > 1000


def _backbone_dtype_pairs(policy_names) -> list[tuple[str, str, str]]:
    """(policy, residual stream's dtype, backbone cache's dtype) for each policy: the cache in the residual's
    dtype, and under fp16-mixed also in FP16 beside the FP32 residual (engine/precision.py backbone_kv_dtype,
    the `half_kv` default)."""
    from breeze_worker.engine.precision import make_policy

    names = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
    pairs = []
    for name in policy_names:
        policy = make_policy(name, "test")
        residual = names[str(policy.weight_dtype)]
        pairs.append((name, residual, residual))
        if policy.mixed:
            pairs.append((name, residual, names[str(policy.gemm_dtype)]))
    return pairs


def test_backbone_rope_kernel_compiles_for_every_policys_cache():
    """Triton's compiler builds the backbone's q/k norm + RoPE kernel (q into a buffer of the residual's dtype,
    k and v into the cache) for every precision policy's pair of dtypes, on sm_90 with chained launches and on
    the T4's sm_75 for the policy `auto` picks there. The interpreter runs Python and accepts a kernel whose two
    branches assign pointers of different element types; the compiler refuses it, as it did for the FP16 cache
    beside FP32 activations."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from breeze_worker.engine.fastpath import fused_kernels
    from breeze_worker.engine.precision import PRECISIONS, policy_for_capability

    targets = [(90, True, PRECISIONS), (75, False, (policy_for_capability((7, 5)),))]
    built = []
    for arch, chained, policies in targets:
        for policy, residual, cache in _backbone_dtype_pairs(policies):
            signature = {"p_ptr": f"*{residual}", "qkn_ptr": f"*{residual}", "cos_ptr": f"*{residual}",
                         "sin_ptr": f"*{residual}", "slot_ptr": "*i64", "q_ptr": f"*{residual}",
                         "k_ptr": f"*{cache}", "v_ptr": f"*{cache}", "eps": "fp32", "stride_rope": "i32",
                         "stride_slot": "i32", "stride_cr": "i32", "stride_ck": "i32", "stride_cl": "i32",
                         "T": "i32", "HEADS": "constexpr", "KV_HEADS": "constexpr", "HEAD_DIM": "constexpr",
                         "HAS_NORM": "constexpr", "USE_PDL": "constexpr"}
            source = ASTSource(fn=fused_kernels._qk_norm_rope_kernel, signature=signature,
                               constexprs={"HEADS": 16, "KV_HEADS": 8, "HEAD_DIM": 128, "HAS_NORM": True,
                                           "USE_PDL": chained})
            kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": 1})
            assert len(kernel.asm["cubin"]) > 1000, (arch, policy, residual, cache)
            built.append((arch, policy, residual, cache))
    assert (75, "fp16-mixed", "fp32", "fp16") in built and (90, "bf16", "bf16", "bf16") in built


def test_launch_plans_fit_the_tile_budget_and_split_k_exactly():
    from breeze_worker.engine.fastpath import fused

    depth_down = fused.plan("down_residual", 8192)
    assert (depth_down["chunk"], depth_down["splits"], depth_down["block_n"]) == (8192, 1, 1)  # _BY_WIDTH
    odd = fused.plan("down_residual", 96)  # chunk: the largest power of two dividing K, at most the default
    assert (odd["chunk"], odd["splits"]) == (32, 3)
    wide = fused.plan("norm_gate_up", 4096)  # two tiles of block x 4096 must fit 8192 elements: block 1
    assert wide["block_n"] == 1 and fused.plan("norm_gate_up", 1024)["block_n"] == 4
    assert fused.plan("qkv_rope", 1024) == {"block_p": 4, "num_warps": 2}
    out_proj = fused.plan("o_residual", 1024)
    assert out_proj["chunk"] * out_proj["splits"] == 1024 and out_proj["block_n"] * 1024 <= 8192


def test_supported_layers_and_shapes(model):
    """The Triton block shapes need powers of two: slots, head size, query heads per KV head; at most 8 rows;
    the backbone's layers (q/k norm) are not depth layers."""
    from breeze_worker.engine.fastpath import fused
    from breeze_worker.engine.fastpath.step import packed_layers

    backbone, depth = packed_layers(model.lm)
    assert fused.supported(depth[0], 2, 16) and fused.supported(depth[0], fused.MAX_ROWS, 16)
    assert not fused.supported(depth[0], fused.MAX_ROWS + 1, 16)
    assert not fused.supported(depth[0], 2, 12)
    assert not fused.supported(backbone[0], 2, 16) and fused.mlp_supported(backbone[0], 2)
