"""The fused kernels themselves (engine/fastpath/fused.py), run by Triton's interpreter on the CPU, give what
their torch stages give (tests/fastpath/fused_interpreter_check.py: FP32 to ~1e-6, FP16 bit for bit or
nearly, odd row counts, both depth step lengths, K split into 1-12 chunks). The interpreter must be chosen
before Triton is imported, hence the subprocess; Triton is a dev dependency (pyproject.toml)."""

from __future__ import annotations

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


def test_launch_plans_fit_the_tile_budget_and_split_k_exactly():
    from breeze_worker.engine.fastpath import fused

    depth_down = fused.plan("down_residual", 8192)
    assert depth_down["chunk"] * depth_down["splits"] == 8192 and depth_down["splits"] == 4
    odd = fused.plan("down_residual", 96)  # chunk: the largest power of two dividing K, at most the default
    assert (odd["chunk"], odd["splits"]) == (32, 3)
    wide = fused.plan("norm_gate_up", 4096)  # two tiles of block x 4096 must fit 8192 elements: block 1
    assert wide["block_n"] == 1 and fused.plan("norm_gate_up", 1024)["block_n"] == 4
    assert fused.plan("qkv_rope", 1024) == {"block_p": 4, "num_warps": 2}
    out_proj = fused.plan("o_residual", 1024)
    assert out_proj["chunk"] * out_proj["splits"] == 1024 and out_proj["block_n"] * 1024 <= 8192


def test_chained_launches_only_where_the_device_has_them(monkeypatch):
    """Programmatic dependent launch: never on the CPU or in the interpreter, off by the environment, and on
    CUDA only from compute capability 9.0 (a T4 is 7.5, an A100 8.0, an H200 9.0)."""
    import torch

    from breeze_worker.engine.fastpath import fused

    monkeypatch.setattr(fused, "_pdl_devices", {})
    assert not fused.pdl(torch.device("cpu")) and fused._launch(torch.device("cpu")) == {"USE_PDL": False}
    if fused._triton is None or not fused._HAS_GDC:
        assert not fused.pdl(torch.device("cuda", 0))
        return
    capability = {}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability[index])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    capability.update({0: (7, 5), 1: (8, 0), 2: (9, 0)})
    assert [fused.pdl(torch.device("cuda", i)) for i in range(3)] == [False, False, True]
    assert fused._launch(torch.device("cuda", 2)) == {"USE_PDL": True, "launch_pdl": True}
    monkeypatch.setenv(fused.PDL_ENV, "off")
    assert not fused.pdl(torch.device("cuda", 2))
    monkeypatch.delenv(fused.PDL_ENV)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not fused.pdl(torch.device("cuda", 2))


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


def _hopper_ptx(kernel, types: dict, constexprs: dict, num_warps: int) -> str:
    """`kernel` built by Triton's compiler (PTX and cubin, not the interpreter) for sm_90; `types` names
    every runtime argument's type, the rest come from `constexprs`."""
    import pytest

    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: "constexpr" if name in constexprs else types[name] for name in kernel.arg_names}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    built = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    assert len(built.asm["cubin"]) > 1000
    return built.asm["ptx"]


def test_prefetching_kernels_compile_for_hopper():
    """The L2 prefetch (inline cp.async.bulk.prefetch, which the interpreter cannot run) goes through ptxas
    in each kernel that takes it, once per range asked for, and is absent when none is."""
    from breeze_worker.engine.fastpath import fused

    if fused._triton is None:
        import pytest
        pytest.skip("no Triton")
    pf = {f"pf{i}": "*bf16" for i in range(3)} | {f"pf{i}_n": "i64" for i in range(3)} | {
        f"pf{i}_c": "i32" for i in range(3)}
    kernels = {
        "_qkv_rope_kernel": ({"x_ptr": "*bf16", "w_norm_ptr": "*bf16", "w_ptr": "*bf16", "cos_ptr": "*bf16",
                              "sin_ptr": "*bf16", "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "H": "i32",
                              "start": "i32", "eps": "fp32", "stride_cr": "i32", "stride_ck": "i32",
                              "stride_cl": "i32"},
                             {"M": 2, "T": 1, "HEADS": 8, "KV_HEADS": 2, "HEAD_DIM": 128, "BLOCK_P": 4, "HP": 1024,
                              "USE_PDL": True}),
        "_norm_gate_up_kernel": ({"x_ptr": "*bf16", "w_norm_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16",
                                  "H": "i32", "I": "i32", "eps": "fp32"},
                                 {"M": 2, "BLOCK_N": 4, "HP": 1024, "EVICT": True, "USE_PDL": True, "GATED": True}),
        "_down_residual_kernel": ({"h_ptr": "*bf16", "w_ptr": "*bf16", "x_ptr": "*bf16", "y_ptr": "*bf16",
                                   "ws_ptr": "*fp32", "count_ptr": "*i32", "N": "i32", "K": "i32"},
                                  {"M": 2, "BLOCK_N": 2, "CHUNK": 2048, "SPLITS": 4, "EVICT": True, "USE_PDL": True}),
    }
    for name, (types, constexprs) in kernels.items():
        kernel = getattr(fused, name)
        for ranges in (0, 1, 3):
            ptx = _hopper_ptx(kernel, types | pf, constexprs | {"PF": ranges, "PF_LANES": 64}, num_warps=2)
            assert ptx.count("cp.async.bulk.prefetch.L2.global") == ranges, (name, ranges)


def test_prefetch_arguments_cover_each_range_once(monkeypatch):
    """Each range asked for is split into 16-byte-multiple chunks of at least 4 KiB over the launch's lanes,
    covering its bytes (capped where asked); nothing where the device cannot prefetch (the CPU, the
    interpreter); at most three ranges; a view that is not contiguous is left out."""
    import torch

    from breeze_worker.engine.fastpath import fused

    weight = torch.zeros(1000, 1024, dtype=torch.bfloat16)
    dummy = torch.zeros(4)
    off = fused.prefetch_args(torch.device("cpu"), [(weight, None)], 64, 2, dummy)
    assert off["PF"] == 0 and off["pf0"] is dummy and off["pf0_n"] == 0
    monkeypatch.setattr(fused, "prefetch_available", lambda device: True)
    ranges = [(weight, None), (weight[:10], 1000), (weight[:, :8], None), (weight, 4096 * 3), (weight, 16)]
    args = fused.prefetch_args(torch.device("cpu"), ranges, 64, 2, dummy)
    assert args["PF"] == 3 and args["PF_LANES"] == 64
    sizes = [args[f"pf{i}_n"] for i in range(3)]
    assert sizes == [1000 * 1024 * 2, 992, 4096 * 3]  # whole; capped and rounded down to 16; the 3rd usable
    for i, nbytes in enumerate(sizes):
        chunk = args[f"pf{i}_c"]
        assert chunk % 16 == 0 and chunk >= 4096 and chunk * 64 * 64 >= nbytes
    assert args["pf1"].data_ptr() == weight.data_ptr()
    # many programs: the chunks stay at 4 KiB and only the first programs' lanes have bytes to fetch
    wide = fused.prefetch_args(torch.device("cpu"), [(weight, None)], 4096, 4, dummy)
    assert wide["pf0_c"] == 4096 and -(-wide["pf0_n"] // 4096) < 4096 * 128


def test_layer_prefetch_follows_the_plan(model, monkeypatch):
    """What each stage of a fused layer prefetches, from plan("prefetch", width) (BREEZE_FUSED_CONFIG may set
    it per width): off by default; the q/k/v stage its output projection and both halves of gate/up alike,
    the gate/up stage the down projection, the down stage the next layer's q/k/v, each capped in MB."""
    import json

    from breeze_worker.engine.fastpath import fused
    from breeze_worker.engine.fastpath.step import packed_layers

    _, depth = packed_layers(model.lm)
    layer, nxt = depth[0], depth[1]
    width = layer.qkv.shape[1]
    assert fused.layer_prefetch(layer, nxt, width) == {"qkv": [], "gate_up": [], "down": []}
    monkeypatch.setenv(fused.CONFIG_ENV, json.dumps(
        {f"prefetch@{width}": {"attn_out": True, "gate_up_mb": 1, "down_mb": 0.5, "next_mb": 2}}))
    plan = fused.layer_prefetch(layer, nxt, width)
    (o, o_bytes), (gate, g_bytes), (up, u_bytes) = plan["qkv"]
    assert o is layer.attn.o_proj.weight and o_bytes is None and g_bytes == u_bytes == 1 << 19
    assert gate.data_ptr() == layer.gate_up.data_ptr() and up.data_ptr() == layer.gate_up[layer.intermediate:].data_ptr()
    assert plan["gate_up"] == [(layer.mlp.down_proj.weight, 1 << 19)] and plan["down"] == [(nxt.qkv, 2 << 20)]
    assert fused.layer_prefetch(layer, None, width)["down"] == []
    assert fused.layer_prefetch(layer, nxt, width + 1) == {"qkv": [], "gate_up": [], "down": []}  # other widths
