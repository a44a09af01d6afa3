"""Kernels launched with a request-dependent integer must not be specialized on it: Triton compiles one
variant per divisibility-by-16 class of an integer argument, so a prompt length in a class the warm-up did not
meet would compile on the first request that has it (on an H200 the first request's time to first audio went
from 2182 ms to 184 ms when this kernel stopped being specialized on the length; docs/performance.md)."""

from __future__ import annotations

import pytest

fused_kernels = pytest.importorskip("breeze_worker.engine.fastpath.fused_kernels")
if fused_kernels._triton is None:
    pytest.skip("Triton does not import here", allow_module_level=True)


def _params(kernel) -> dict:
    return {p.name: p for p in kernel.params}


def test_the_prefill_kernel_is_not_specialized_on_the_prompt_length():
    params = _params(fused_kernels._qk_norm_rope_kernel)
    for name in ("T", "stride_slot"):  # the prompt's length, and the slot table's row stride (T, or 0)
        p = params[name]
        assert p.do_not_specialize or p.do_not_specialize_on_alignment, name
    # what is fixed per model stays specialized (compile-time constants and the per-model strides)
    assert params["HEADS"].is_constexpr and params["HEAD_DIM"].is_constexpr
    assert not params["stride_ck"].do_not_specialize_on_alignment
