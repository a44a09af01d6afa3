"""The fast path's choices, each made once from the settings and the device: the layer form by row count and
compilation (fastpath/forms.py `select_form`) with each form's fallback, whether to compile, who samples,
and whether the fused kernels launch chained (by compute capability). A kernel that cannot be built moves a
runner to its form's fallback (test_compiled_and_padded.py runs that end to end)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.fastpath import forms, fused
from breeze_worker.engine.fastpath.compiled import compile_wanted, sampling_kernel_wanted

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize("rows, compiled, requested, chosen", [
    (1, True, "auto", "fused+chain+all"),  # one stream without CFG
    (2, True, "auto", "fused+chain+all"),  # one stream with CFG
    (3, True, "auto", "gemm+attention"),
    (48, True, "auto", "gemm+attention"),  # 32 streams, half with CFG
    (2, False, "auto", "gemm"),  # uncompiled: always the library GEMMs
    (48, False, "units+attn", "gemm"),  # a requested form applies to the compiled step only
    (2, True, "gemm", "gemm"),
    (48, True, "fused+chain+all", "fused+chain+all"),
    (2, True, "units+attn", "units+attn"),
])
def test_the_form_by_rows_and_compilation(rows, compiled, requested, chosen):
    form = forms.select_form(rows, compiled=compiled, requested=requested)
    assert form is forms.FORMS[chosen] and form.name == chosen
    assert forms.FUSED_ROWS == 2


def test_only_the_live_forms_are_offered_and_each_names_its_fallback():
    assert set(forms.FORMS) == {"fused+chain+all", "gemm+attention", "gemm", "units+attn"}
    chain = {name: forms.fallback_of(form) for name, form in forms.FORMS.items()}
    assert chain["fused+chain+all"] is forms.FORMS["units+attn"] and chain["gemm+attention"] is forms.FORMS["gemm"]
    assert chain["units+attn"] is None and chain["gemm"] is None  # no Triton kernel of ours: retry uncompiled
    with pytest.raises(ValueError, match="expected one of fused\\+chain\\+all, gemm\\+attention, units\\+attn, gemm"):
        forms.select_form(2, compiled=True, requested="fused+mlp")  # a removed form


def test_what_each_form_does_beside_its_layers():
    fused_form, batched, gemm, units = (forms.FORMS[n] for n in ("fused+chain+all", "gemm+attention", "gemm",
                                                                 "units+attn"))
    # few rows: pairwise top-k/top-p, reductions for the depth input projection and logits, the depth head kernel
    assert fused_form.pairwise_sampling and fused_form.small_row_projections and fused_form.depth_head_kernel
    for form in (batched, gemm, units):
        assert not (form.pairwise_sampling or form.small_row_projections or form.depth_head_kernel), form
    # the library-GEMM forms take FP32 logits from the half-precision heads in one GEMM
    assert batched.half_logits and gemm.half_logits and not fused_form.half_logits and not units.half_logits


def test_settings_refuse_what_they_cannot_serve():
    with pytest.raises(ValueError, match="BREEZE_FASTPATH_FORM"):
        FastPathSettings(form="fast-please")
    with pytest.raises(ValueError, match="BREEZE_FASTPATH_COMPILE"):
        FastPathSettings(compile="sometimes")
    with pytest.raises(ValueError, match="BREEZE_FASTPATH_SAMPLER"):
        FastPathSettings(sampler="fastest")


def test_compilation_by_device_and_setting():
    assert not compile_wanted(CPU, FastPathSettings())  # auto: CUDA with Triton only
    assert compile_wanted(CUDA, FastPathSettings()) == (importlib.util.find_spec("triton") is not None)
    assert compile_wanted(CPU, FastPathSettings(compile="on"))
    assert not compile_wanted(CUDA, FastPathSettings(compile="off"))


def test_the_sampler_by_device_and_kernel_support(monkeypatch):
    """auto: the kernel where it runs, on CUDA only; kernel where it cannot run is refused; torch always the
    torch sampler; settings whose kernels are off (use_triton False) have no sampling kernel anywhere."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not sampling_kernel_wanted(CPU, FastPathSettings())
    assert not sampling_kernel_wanted(CUDA, FastPathSettings(sampler="torch"))
    with pytest.raises(ValueError, match="needs Triton and a CUDA device"):
        sampling_kernel_wanted(CPU, FastPathSettings(sampler="kernel"))
    no_kernels = FastPathSettings(kernels=fused.KernelSettings(use_triton=False))
    assert not sampling_kernel_wanted(CUDA, no_kernels)
    assert sampling_kernel_wanted(CUDA, FastPathSettings()) == (fused._triton is not None)


def test_chained_launches_only_where_the_device_has_them(monkeypatch):
    """Programmatic dependent launch: never on the CPU or in the interpreter, off by the settings, and on CUDA
    only from compute capability 9.0 (a T4 is 7.5, an A100 8.0, an H200 9.0)."""
    monkeypatch.setattr(fused, "_pdl_devices", {})
    on, off = fused.KernelSettings(), fused.KernelSettings(chained=False)
    assert not fused.pdl(CPU, on) and fused._launch(CPU, on) == {"USE_PDL": False}
    if fused._triton is None or not fused._HAS_GDC:
        assert not fused.pdl(CUDA, on)
        return
    capability = {}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability[index])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    capability.update({0: (7, 5), 1: (8, 0), 2: (9, 0)})
    assert [fused.pdl(torch.device("cuda", i), on) for i in range(3)] == [False, False, True]
    assert fused._launch(torch.device("cuda", 2), on) == {"USE_PDL": True, "launch_pdl": True}
    assert not fused.pdl(torch.device("cuda", 2), off)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not fused.pdl(torch.device("cuda", 2), on)


def test_kernel_support_by_device_and_settings(monkeypatch):
    """The fused kernels run on CUDA with Triton (on the CPU only in Triton's interpreter), never with
    use_triton off; elsewhere every stage runs its torch form."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not fused.available(CPU) and not fused.available(CUDA, fused.KernelSettings(use_triton=False))
    assert fused.available(CUDA) == (fused._triton is not None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fused.available(CPU) == (fused._triton is not None)
