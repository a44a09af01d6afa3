"""The fast path's settings are a section of the worker's one configuration surface (breeze_worker/config.py
reads the environment, under the variable names the fast path always had) and reach the steps explicitly: the
runtime's batched stepper, its bucket views and the batch-1 generator all carry the same `FastPathSettings`."""

from __future__ import annotations

import pytest

from breeze_worker.config import EngineSettings, FastPathSettings, KernelSettings, SettingsError, WorkerSettings
from breeze_worker.engine.fastpath import fused


def test_the_defaults_are_the_served_ones():
    assert WorkerSettings.from_env({}).engine.fastpath == EngineSettings().fastpath == FastPathSettings()
    assert fused.KernelSettings is KernelSettings and fused.DEFAULT_KERNELS == KernelSettings()
    d = FastPathSettings()
    assert (d.compile, d.compile_backend, d.form, d.tune, d.sampler) == ("auto", "inductor", "auto", False, "auto")
    assert d.read_overlap and d.kernels == KernelSettings(chained=True, plans={}, use_triton=True)


def test_every_variable_is_read_by_the_worker_settings():
    env = {"BREEZE_FASTPATH_COMPILE": "1", "BREEZE_FASTPATH_COMPILE_BACKEND": "aot_eager",
           "BREEZE_FASTPATH_FORM": "GEMM", "BREEZE_FASTPATH_TUNE": "on", "BREEZE_FASTPATH_SAMPLER": "torch",
           "BREEZE_FASTPATH_READ_OVERLAP": "off", "BREEZE_FUSED_PDL": "off",
           "BREEZE_FUSED_CONFIG": '{"sample": {"num_warps": 4}, "norm_gate_up@2048": {"block_n": 1}}'}
    got = WorkerSettings.from_env(env).validate().engine.fastpath
    assert got == FastPathSettings(compile="on", compile_backend="aot_eager", form="gemm", tune=True, sampler="torch",
                                   read_overlap=False,
                                   kernels=KernelSettings(chained=False, plans={"sample": {"num_warps": 4},
                                                                                "norm_gate_up@2048": {"block_n": 1}}))
    # the launch-plan overrides reach the plans, by kernel and by kernel and width
    assert fused.plan("sample", 2051, got.kernels)["num_warps"] == 4 and fused.plan("sample", 2051)["num_warps"] == 8
    assert fused.plan("norm_gate_up", 2048, got.kernels)["block_n"] == 1
    assert fused.plan("norm_gate_up", 1024, got.kernels) == fused.plan("norm_gate_up", 1024)
    # the names of the engine's own settings are unchanged
    assert WorkerSettings.from_env({"BREEZE_ENGINE_FASTPATH_FORM": "gemm"}).engine.fastpath.form == "auto"


@pytest.mark.parametrize("name, value, message", [
    ("BREEZE_FASTPATH_FORM", "fused+mlp", r"--fastpath-form \(BREEZE_FASTPATH_FORM\) must be auto, .*gemm, not "
                                          "'fused\\+mlp'"),  # a removed form
    ("BREEZE_FASTPATH_COMPILE", "sometimes", r"--fastpath-compile \(BREEZE_FASTPATH_COMPILE\) must be auto, on or "
                                             "off, not 'sometimes'"),
    ("BREEZE_FASTPATH_SAMPLER", "fastest", r"--fastpath-sampler \(BREEZE_FASTPATH_SAMPLER\) must be"),
    ("BREEZE_FUSED_CONFIG", "{not json", r"BREEZE_FUSED_CONFIG='\{not json' \(--fused-plans\): is not valid JSON"),
    ("BREEZE_FUSED_CONFIG", '{"sample": 4}', r"BREEZE_FUSED_CONFIG=.* \(--fused-plans\): must be a JSON object"),
    ("BREEZE_FASTPATH_TUNE", "maybe", r"BREEZE_FASTPATH_TUNE='maybe' \(--fastpath-tune\): 'maybe' is not a switch"),
    ("BREEZE_FASTPATH_COMPILE_BACKEND", " ", None),  # an empty variable is an unset one
])
def test_bad_values_say_which_variable_and_flag_to_change(name, value, message):
    if message is None:
        assert WorkerSettings.from_env({name: value}).engine.fastpath == FastPathSettings()
        return
    with pytest.raises(SettingsError, match=message):
        WorkerSettings.from_env({name: value}).validate()


def test_settings_made_in_code_are_checked_too():
    with pytest.raises(SettingsError, match=r"--fastpath-form \(BREEZE_FASTPATH_FORM\) must be"):
        FastPathSettings(form="fused+chain")
    with pytest.raises(SettingsError, match=r"--fastpath-compile-backend \(BREEZE_FASTPATH_COMPILE_BACKEND\) is empty"):
        FastPathSettings(compile_backend="")
    with pytest.raises(SettingsError, match=r"--fused-plans \(BREEZE_FUSED_CONFIG\) must map kernel names"):
        KernelSettings(plans={"sample": 4})
    with pytest.raises(SettingsError, match=r"--fused-chained \(BREEZE_FUSED_PDL\) must be true or false"):
        KernelSettings(chained="no")


def test_the_form_names_are_the_live_forms():
    from breeze_worker.config import FORM_NAMES
    from breeze_worker.engine.fastpath.forms import FORMS

    assert set(FORM_NAMES) == set(FORMS)


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

    fastpath = FastPathSettings(sampler="torch", compile="off", read_overlap=False,
                                kernels=KernelSettings(chained=False))
    engine = EngineSettings(device="cpu", fast_path="fast", max_active_streams=2, fastpath=fastpath)
    runtime = Runtime.load(engine)
    want = runtime.fastpath
    assert want is fastpath and not want.read_overlap and not want.kernels.chained
    stepper = runtime.stepper
    assert stepper.step_buffers.settings is want and stepper.step_buffers.kernels is want.kernels
    assert all(view.settings is want for view in stepper.graphs.views.values())
    assert stepper.step_buffers.sample_kernel is False
    from breeze_worker.engine.runtime import _probe_request

    gen = runtime.open_frames(_probe_request(frames=2))
    assert gen.settings is want and len(list(gen)) == 2


def test_a_bench_path_names_compilation_form_and_sampler():
    from breeze_worker.measure.runner import fast_settings

    base = FastPathSettings(read_overlap=False)
    got = fast_settings("fast-compiled::torch", base)
    assert (got.compile, got.form, got.sampler, got.read_overlap) == ("on", "auto", "torch", False)
    got = fast_settings("fast-uncompiled:gemm+attention", base)
    assert (got.compile, got.form, got.sampler) == ("off", "gemm+attention", "auto")
    assert fast_settings("fast", base) == base
    with pytest.raises(ValueError, match="BREEZE_FASTPATH_FORM"):
        fast_settings("fast-compiled:fused+chain", base)  # a removed form
