"""The L2 prefetch (engine/fastpath/prefetch.py): which chunks the kernel asks for (Triton's interpreter, in its
recording mode), that the kernels carrying it compile for Hopper with the bulk prefetch in them, and which
weight ranges a layer's chain asks for under plan "l2"."""

from __future__ import annotations

import pytest
import torch


def test_prefetch_chunks_cover_each_range_exactly_once_in_the_interpreter(interpreter_check):
    cases = interpreter_check("prefetch_interpreter_check.py")
    assert len(cases) == 4 and all(c["ok"] for c in cases)
    assert cases[1]["chunks"] == 1 and cases[0]["chunks"] > 1
    assert all(c["written"] > 0 for c in cases)


def test_chunk_sizes_and_kernel_arguments():
    from breeze_worker.engine.fastpath import prefetch

    request = prefetch.regions((1 << 20, 16 << 20), (1 << 30, 1 << 20))
    chunk = prefetch.chunk_bytes(request, 192 * 64)
    assert chunk % 16 == 0 and prefetch.chunk_count(request, chunk) <= 192 * 64
    assert prefetch.chunk_count(request, chunk - 16) > 192 * 64 - 2  # not much larger than needed
    for a, b, threads in ((540672, 20480, 256), (16, 16, 2), (1 << 20, 48, 7)):  # each range rounds up
        req = prefetch.regions((1 << 20, a), (1 << 30, b))
        assert prefetch.chunk_count(req, prefetch.chunk_bytes(req, threads)) <= threads
    assert prefetch.chunk_bytes(prefetch.regions((1 << 20, 64)), 1024) == 512  # the floor on a chunk
    args = prefetch.kernel_args(request, 192, 2)
    assert args["PF"] and args["PF_THREADS"] == 64 and args["pf_an"] == 16 << 20 and args["pf_b"] == 1 << 30
    off = prefetch.kernel_args(None, 192, 2)
    assert not off["PF"] and off["pf_an"] == off["pf_bn"] == 0
    assert not prefetch.kernel_args(prefetch.NONE, 4, 4)["PF"]


def test_rows_are_the_leading_share_of_a_weight():
    from breeze_worker.engine.fastpath import prefetch

    w = torch.zeros(64, 24, dtype=torch.bfloat16)  # 48 bytes a row
    assert prefetch.rows(w, 0.5) == (w.data_ptr(), 32 * 48)
    assert prefetch.rows(w, 1.0, start=32, count=32) == (w.data_ptr() + 32 * 48, 32 * 48)
    assert prefetch.rows(w, 0.0) == (0, 0)
    narrow = w[:, :4].contiguous()  # 8 bytes a row: whole multiples of 16 bytes only
    assert prefetch.rows(narrow, 1 / 64) == (0, 0) and prefetch.rows(narrow, 3 / 64) == (narrow.data_ptr(), 16)
    with pytest.raises(ValueError, match="contiguous"):
        prefetch.rows(w[:, :8], 1.0)


def test_no_prefetch_off_hopper():
    from breeze_worker.engine.fastpath import prefetch

    assert not prefetch.available(torch.device("cpu"))
    assert not prefetch.launch(prefetch.regions((1 << 20, 4096)), torch.device("cpu"))


def test_a_layer_chain_asks_for_its_mlp_and_the_next_layers_attention_weights(model, monkeypatch):
    from breeze_worker.engine.fastpath import fused, prefetch
    from breeze_worker.engine.fastpath.step import packed_layers

    _, depth = packed_layers(model.lm)
    layer, following = depth[0], depth[1]
    cpu = torch.device("cpu")
    assert fused.layer_prefetch(layer, following, cpu) == {}  # the plan's default: off
    monkeypatch.setattr(prefetch, "available", lambda device: True)
    assert fused.layer_prefetch(layer, following, cpu) == {}  # still off by plan
    width = layer.w_in.shape[0]
    monkeypatch.setattr(fused, "_config_override", {f"l2@{width}": {"on": True, "gate_up": 0.5, "down": 1.0,
                                                                     "next": 1.0}})
    l2 = fused.layer_prefetch(layer, following, cpu)
    n, row = layer.intermediate, layer.gate_up.stride(0) * layer.gate_up.element_size()
    gate, up = l2["qkv"][:2], l2["qkv"][2:]
    assert gate == (layer.gate_up.data_ptr(), (n // 2) * row // 16 * 16)
    assert up == (layer.gate_up.data_ptr() + n * row, (n // 2) * row // 16 * 16)  # the up rows start at I
    down = layer.mlp.down_proj.weight
    assert l2["gate_up"] == (down.data_ptr(), down.numel() * down.element_size() // 16 * 16, 0, 0)
    assert l2["down"][0] == following.qkv.data_ptr() and l2["down"][2] == following.attn.o_proj.weight.data_ptr()
    assert "down" not in fused.layer_prefetch(layer, None, cpu)  # the backbone's last layer: nothing after it
    monkeypatch.setattr(fused, "_config_override", {f"l2@{width + 1}": {"on": True}})
    assert fused.layer_prefetch(layer, following, cpu) == {}  # another width's plan


def test_the_kernels_with_the_prefetch_compile_for_hopper():
    """Triton's compiler (not its interpreter) builds the prefetch kernel and a fused kernel carrying the
    prefetch for sm_90, with the bulk prefetch instruction in the PTX; without it, none."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from breeze_worker.engine.fastpath import fused, prefetch

    target = GPUTarget("cuda", 90, 32)
    sig = {"a_addr": "i64", "a_bytes": "i64", "b_addr": "i64", "b_bytes": "i64", "chunk": "i64",
           "record_ptr": "*i64", "THREADS": "constexpr", "RECORD": "constexpr"}
    built = triton.compile(ASTSource(fn=prefetch._prefetch_l2_kernel, signature=sig,
                                     constexprs={"THREADS": 128, "RECORD": False}),
                           target=target, options={"num_warps": 4})
    assert built.asm["ptx"].count("cp.async.bulk.prefetch.L2.global") == 1
    sig = {"x_ptr": "*bf16", "w_norm_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "H": "i32", "I": "i32",
           "eps": "fp32", "pf_a": "i64", "pf_an": "i64", "pf_b": "i64", "pf_bn": "i64", "pf_chunk": "i64",
           "M": "constexpr", "BLOCK_N": "constexpr", "HP": "constexpr", "EVICT": "constexpr", "USE_PDL": "constexpr",
           "GATED": "constexpr", "PF": "constexpr", "PF_THREADS": "constexpr"}
    for pf in (True, False):
        built = triton.compile(ASTSource(fn=fused._norm_gate_up_kernel, signature=sig,
                                         constexprs={"M": 2, "BLOCK_N": 4, "HP": 1024, "EVICT": True, "USE_PDL": True,
                                                     "GATED": True, "PF": pf, "PF_THREADS": 64}),
                               target=target, options={"num_warps": 2})
        assert ("cp.async.bulk.prefetch.L2.global" in built.asm["ptx"]) == pf and len(built.asm["cubin"]) > 1000
