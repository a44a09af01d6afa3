"""The sampling kernel (engine/fastpath/fused_sampling.py), run by Triton's interpreter on the CPU, keeps the
same tokens as the sorted top-k / top-p reference and draws the same codes as `sample_rows`
and, inside the fast path's frame step, the eager reference's frames (tests/fastpath/
sampling_interpreter_check.py, in a subprocess: the interpreter must be chosen before Triton is imported)."""

from __future__ import annotations


def test_sampling_kernel_matches_the_torch_sampler_in_the_interpreter(interpreter_check):
    cases = interpreter_check("sampling_interpreter_check.py")
    assert len(cases) == 17 and all(c["ok"] for c in cases)
    extreme = [c for c in cases if c.get("extreme")]  # the smallest noise on every cut token: none drawn
    assert len(extreme) == 2 and all(c["inside_filter"] for c in extreme)
    rows_cases = [c for c in cases if c["kind"] != "frames"]
    assert all(c["next_ok"] for c in rows_cases)  # the next-input rows written for each stream's rows
    blocks = {c["vocab"]: tuple(c["blocks"]) for c in rows_cases}
    assert blocks[2051] == blocks[2052] == (2048, 4) and blocks[3000] == (2048, 1024) and blocks[2048] == (2048, 0)
    rows = [c for c in cases if c["kind"] != "frames"]
    assert all(c["keep_rows_equal"] == c["code_rows_equal"] == c["rows"] for c in rows)
    assert all(c["filtered_something"] for c in rows)  # the filters cut tokens in every case
    # inside the fast path's frame step (tiny model, FP32, with and without CFG): the eager reference's frames
    frames = [c for c in cases if c["kind"] == "frames"]
    assert [(c["cfg"], c["frames"], c["kernel_calls"], c["streams"]) for c in frames] == [(False, 5, 80, [1]),
                                                                                         (True, 5, 80, [1])]
    assert {c["kind"] for c in cases} >= {"ties", "zeros", "sparse", "peaked", "nonfinite"}
    nonfinite = next(c for c in cases if c["kind"] == "nonfinite")
    assert nonfinite["nonfinite_rows"] == 2 and nonfinite["compared_rows"] == 6 and nonfinite["flags_ok"]
    tied = [c for c in cases if c["kind"] == "ties"]
    # an all-tied row keeps every unblocked token under top-k 50
    assert all(c["kept"][0] == c["vocab"] - 4 for c in tied)


def test_sampling_kernel_compiles_for_hopper():
    """Triton's compiler (not its interpreter, which accepts more) builds the kernel for sm_90 in both block
    layouts, with and without its extras (the early-stopped search's while loop, the next-input write, the
    chained launch): the GPU's frontend rejected a first version that the interpreter ran."""
    import pytest

    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from breeze_worker.engine.fastpath import fused_sampling

    signature = {"logits_ptr": "*fp32", "stride_l": "i32", "blocked_ptr": "*u8", "temp_ptr": "*fp32",
                 "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "log_noise_ptr": "*fp32", "stride_n": "i32",
                 "code_ptr": "*i64", "stride_code": "i32", "nonfinite_ptr": "*u8", "keep_ptr": "*i64",
                 "table_ptr": "*bf16", "stride_t": "i32", "next_ptr": "*bf16", "stride_next": "i32",
                 "cond_ptr": "*i64", "uncond_ptr": "*i64", "ref_ptr": "*i64", "H": "i32", "V": "i32",
                 "VP": "constexpr", "VT": "constexpr", "WRITE_KEEP": "constexpr", "WRITE_NEXT": "constexpr",
                 "HP": "constexpr", "USE_PDL": "constexpr"}
    # 2051 classes as 2048 + 4 (fused_sampling.blocks), and a power of two (no tail block)
    for (head, tail), extras in [(fused_sampling.blocks(vocab), extras) for vocab in (2051, 2048)
                                 for extras in (True, False)]:
        source = ASTSource(fn=fused_sampling._sample_kernel, signature=signature,
                           constexprs={"VP": head, "VT": tail, "WRITE_KEEP": extras, "WRITE_NEXT": extras,
                                       "HP": 1024, "USE_PDL": extras})
        built = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
        assert "_sample_kernel" in built.asm["ptx"] and len(built.asm["cubin"]) > 1000
        assert ("griddepcontrol.wait" in built.asm["ptx"]) == extras


def test_the_runner_serves_with_the_sampler_its_settings_name(model, monkeypatch):
    """A runner whose settings ask for the torch sampler serves with it; one asking for the kernel where it
    cannot run (the CPU, no interpreter) is refused with a message naming the setting."""
    import pytest
    import torch

    from breeze_worker.config import FastPathSettings
    from breeze_worker.engine.fastpath.graph import FrameRunner

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = torch.device("cpu")
    runner = FrameRunner(model.lm, 2, 64, cpu, use_graphs=False, settings=FastPathSettings(compile="off",
                                                                                           sampler="torch"))
    assert runner.sampler_requested == "torch" and runner.step.sample_kernel is False
    with pytest.raises(ValueError, match="BREEZE_FASTPATH_SAMPLER=kernel"):
        FrameRunner(model.lm, 2, 64, cpu, use_graphs=False, settings=FastPathSettings(compile="off", sampler="kernel"))
