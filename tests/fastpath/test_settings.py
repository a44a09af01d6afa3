"""The fast path's settings come from the worker's one configuration surface (breeze_worker/config.py reads the
environment, under the variable names the fast path always had) and reach the steps explicitly: the runtime's
batched stepper, its bucket views and the batch-1 generator all carry the same `FastPathSettings`."""

from __future__ import annotations

import pytest

from breeze_worker.config import EngineSettings, WorkerSettings
from breeze_worker.engine.fastpath.fused import KernelSettings
from breeze_worker.engine.fastpath.settings import FastPathSettings


def test_the_defaults_are_the_served_ones():
    assert FastPathSettings.from_engine(EngineSettings()) == FastPathSettings()
    d = FastPathSettings()
    assert (d.compile, d.compile_backend, d.form, d.tune, d.sampler) == ("auto", "inductor", "auto", False, "auto")
    assert d.read_overlap and not d.pipeline and d.kernels == KernelSettings(chained=True, plans={}, use_triton=True)


def test_every_variable_is_read_by_the_worker_settings():
    env = {"BREEZE_FASTPATH_COMPILE": "1", "BREEZE_FASTPATH_COMPILE_BACKEND": "aot_eager",
           "BREEZE_FASTPATH_FORM": "GEMM", "BREEZE_FASTPATH_TUNE": "on", "BREEZE_FASTPATH_SAMPLER": "torch",
           "BREEZE_FASTPATH_READ_OVERLAP": "off", "BREEZE_FASTPATH_PIPELINE": "yes", "BREEZE_FUSED_PDL": "off",
           "BREEZE_FUSED_CONFIG": '{"sample": {"num_warps": 4}, "norm_gate_up@2048": {"block_n": 1}}'}
    engine = WorkerSettings.from_env(env).engine
    engine.validate()
    got = FastPathSettings.from_engine(engine)
    assert got == FastPathSettings(compile="on", compile_backend="aot_eager", form="gemm", tune=True, sampler="torch",
                                   read_overlap=False, pipeline=True,
                                   kernels=KernelSettings(chained=False, plans={"sample": {"num_warps": 4},
                                                                                "norm_gate_up@2048": {"block_n": 1}}))
    # the launch-plan overrides reach the plans, by kernel and by kernel and width
    from breeze_worker.engine.fastpath import fused

    assert fused.plan("sample", 2051, got.kernels)["num_warps"] == 4 and fused.plan("sample", 2051)["num_warps"] == 8
    assert fused.plan("norm_gate_up", 2048, got.kernels)["block_n"] == 1
    assert fused.plan("norm_gate_up", 1024, got.kernels) == fused.plan("norm_gate_up", 1024)
    # the names of the engine's own settings are unchanged
    assert WorkerSettings.from_env({"BREEZE_ENGINE_FASTPATH_FORM": "gemm"}).engine.fastpath_form == "auto"


@pytest.mark.parametrize("name, value, message", [
    ("BREEZE_FASTPATH_FORM", "fused+mlp", "BREEZE_FASTPATH_FORM"),  # a removed form
    ("BREEZE_FASTPATH_COMPILE", "sometimes", "BREEZE_FASTPATH_COMPILE"),
    ("BREEZE_FASTPATH_SAMPLER", "fastest", "BREEZE_FASTPATH_SAMPLER"),
    ("BREEZE_FUSED_CONFIG", "{not json", "BREEZE_FUSED_CONFIG is not valid JSON"),
    ("BREEZE_FUSED_CONFIG", '{"sample": 4}', "BREEZE_FUSED_CONFIG must be a JSON object"),
    ("BREEZE_FASTPATH_TUNE", "maybe", "BREEZE_FASTPATH_TUNE"),
])
def test_bad_values_say_which_variable_to_change(name, value, message):
    with pytest.raises(ValueError, match=message):
        WorkerSettings.from_env({name: value}).validate()


def test_settings_are_frozen_and_hashable_keys():
    a = FastPathSettings(kernels=KernelSettings(plans={"sample": {"num_warps": 4}}))
    b = FastPathSettings(kernels=KernelSettings(plans={"sample": {"num_warps": 4}}))
    assert a == b and hash(a) == hash(b) and a != FastPathSettings()
    with pytest.raises(AttributeError):
        a.form = "gemm"


def test_the_runtime_passes_its_settings_down(monkeypatch):
    """The worker's runtime builds the fast path from its EngineSettings: the batched stepper, its step buffers
    and views, and the batch-1 generator carry those settings (here: the torch sampler, uncompiled, on the CPU)."""
    from breeze_worker.engine.runtime import Runtime

    engine = EngineSettings(device="cpu", fast_path="fast", max_active_streams=2, fastpath_sampler="torch",
                            fastpath_compile="off", fastpath_pipeline=True, fused_chained=False)
    runtime = Runtime.load(engine)
    want = runtime.fastpath
    assert want == FastPathSettings.from_engine(engine) and want.pipeline and not want.kernels.chained
    stepper = runtime.stepper
    assert stepper.step_buffers.settings is want and stepper.step_buffers.kernels is want.kernels
    assert all(view.settings is want for view in stepper.graphs.views.values())
    assert stepper.step_buffers.sample_kernel is False
    from breeze_worker.engine.runtime import _probe_request

    gen = runtime.open_frames(_probe_request(frames=2))
    assert gen.settings is want and len(list(gen)) == 2


def test_a_bench_path_names_compilation_form_and_sampler():
    from breeze_worker.bench.runner import fast_settings

    base = FastPathSettings(pipeline=True)
    got = fast_settings("fast-compiled::torch", base)
    assert (got.compile, got.form, got.sampler, got.pipeline) == ("on", "auto", "torch", True)
    got = fast_settings("fast-uncompiled:gemm+attention", base)
    assert (got.compile, got.form, got.sampler) == ("off", "gemm+attention", "auto")
    assert fast_settings("fast", base) == base
    with pytest.raises(ValueError, match="BREEZE_FASTPATH_FORM"):
        fast_settings("fast-compiled:fused+chain", base)  # a removed form
