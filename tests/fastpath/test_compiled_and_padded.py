"""The fast path's two shape-fixing devices keep the frames exact in FP32 on the tiny model:
- the prompt left-padded to its cache bucket (as the GPU's prefill graphs run it);
- the step's units traced by `torch.compile` (fullgraph, static shapes; backend `aot_eager` on the CPU, so
  the test checks Dynamo's tracing and functionalization without generating code)."""

from __future__ import annotations

import pytest
import torch

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.fastpath import fused, layers
from breeze_worker.engine.fastpath.generator import FastFrameGenerator
from breeze_worker.engine.fastpath.graph import FrameRunner, acquire_runner, clear_runners, release_runner

# compiled with Dynamo's tracing and functionalization but no code generation (the CPU has no Triton kernels)
COMPILED = FastPathSettings(compile="on", compile_backend="aot_eager")


def _equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("cfg", [False, True])
def test_padded_prompt_gives_the_same_frames(model, request_for, monkeypatch, cfg):
    request = request_for(model, cfg, frames=4)
    eager = list(EagerFrameGenerator(model, request, "cpu"))
    monkeypatch.setattr(FrameRunner, "pad_prompts_without_graphs", True)
    clear_runners()
    gen = FastFrameGenerator(model, request, "cpu")
    fast = list(gen)
    clear_runners()
    assert len(fast) == 4 and _equal(eager, fast)


def test_compiled_units_give_the_same_frames(model, request_for, monkeypatch):
    request = request_for(model, True, frames=3)
    eager = list(EagerFrameGenerator(model, request, "cpu"))
    clear_runners()
    gen = FastFrameGenerator(model, request, "cpu", settings=COMPILED)
    fast = list(gen)
    runner = gen.runner or None
    clear_runners()
    assert _equal(eager, fast)
    assert runner is None  # released; the step it used ran compiled (checked below)
    again = acquire_runner(model.lm, 2, model.generation_defaults.max_sequence, torch.device("cpu"), COMPILED)
    assert again.compiled and again.compile_fallback_reason is None
    clear_runners()


@pytest.mark.parametrize("form", ["units+attn", "fused+chain+all", "gemm+attention"])
def test_compiled_forms_give_the_same_frames(model, request_for, monkeypatch, form):
    """Each compiled layer form (fastpath/forms.py; `gemm` below) samples the eager reference's frames, CFG on
    (2 rows), and runs its layers where it says: `fused+chain+all` every depth layer step and every backbone
    layer step as the fused kernels (their torch stages here), `gemm+attention` the depth attention as
    fused.depth_attention between library-GEMM units, `units+attn` none of them."""
    settings = COMPILED.with_changes(form=form)
    fused_layers, fused_mlps, backbone_layers, attentions = [], [], [], []
    real_depth_layer, real_mlp, real_backbone = fused.depth_layer, fused.mlp, fused.backbone_layer
    real_attention = fused.depth_attention
    monkeypatch.setattr(fused, "depth_attention", lambda *a, **k: attentions.append(1) or real_attention(*a, **k))
    monkeypatch.setattr(fused, "backbone_layer", lambda *a, **k: backbone_layers.append(1) or real_backbone(*a, **k))
    monkeypatch.setattr(fused, "depth_layer", lambda *a, **k: fused_layers.append(1) or real_depth_layer(*a, **k))
    monkeypatch.setattr(fused, "mlp", lambda layer, x, *a: fused_mlps.append(x.shape[-1]) or real_mlp(layer, x, *a))
    request = request_for(model, True, frames=3)
    eager = list(EagerFrameGenerator(model, request, "cpu"))
    clear_runners()
    runner = acquire_runner(model.lm, 2, model.generation_defaults.max_sequence, torch.device("cpu"), settings)
    assert runner.compiled and runner.step.form.name == form
    release_runner(model.lm, runner)
    for calls in (fused_layers, fused_mlps, backbone_layers, attentions):
        calls.clear()  # count the request's frames only (not the runner's warm-up)
    fast = list(FastFrameGenerator(model, request, "cpu", settings=settings))
    clear_runners()
    assert len(fast) == 3 and _equal(eager, fast)
    depth_layer_steps = 3 * 15 * model.lm.config.depth.num_hidden_layers  # 15 depth positions per frame
    chained = form == "fused+chain+all"
    assert len(fused_layers) == (depth_layer_steps if chained else 0)
    assert len(attentions) == (depth_layer_steps if form != "units+attn" else 0)
    # every backbone layer step of the request's frames (2 after the first) as fused kernels, MLP included
    backbone_steps = 2 * model.lm.config.backbone.num_hidden_layers
    assert len(backbone_layers) == (backbone_steps if chained else 0)
    assert fused_mlps.count(model.lm.config.backbone.hidden_size) == (backbone_steps if chained else 0)


@pytest.mark.parametrize("compile", [False, True])
def test_gemm_form_writes_the_depth_cache_in_place(model, request_for, monkeypatch, compile):
    """The "gemm" form (the uncompiled step's, and gemm+attention's fallback): the depth decoder's keys and values go
    straight into their slot, the same for every row; only the backbone's layers scatter (each row at its
    own position), once per layer and frame; compiled, between the layer's units. The frames stay the eager
    reference's."""
    settings = COMPILED.with_changes(form="gemm")
    scattered = []
    real = layers.write_cache
    monkeypatch.setattr(layers, "write_cache",
                        lambda k_cache, *a: scattered.append(k_cache.shape[2]) or real(k_cache, *a))
    whole_layers = []  # the backbone's layers as one `decode_layer` call (the uncompiled step only)
    real_decode = layers.PackedLayer.decode
    monkeypatch.setattr(layers.PackedLayer, "decode",
                        lambda self, *a, **k: whole_layers.append(1) or real_decode(self, *a, **k))
    request = request_for(model, True, frames=3)
    eager = list(EagerFrameGenerator(model, request, "cpu"))
    clear_runners()
    scattered.clear()
    whole_layers.clear()
    settings = settings.with_changes(compile="on" if compile else "off")
    fast = list(FastFrameGenerator(model, request, "cpu", settings=settings))
    clear_runners()
    assert _equal(eager, fast)
    depth_slots = model.lm.config.num_codebooks  # the depth cache: one slot per codebook position (16)
    assert model.generation_defaults.max_sequence != depth_slots
    assert scattered and depth_slots not in scattered  # no depth-cache scatter at all
    assert len(scattered) % model.lm.config.backbone.num_hidden_layers == 0
    # compiled, the backbone runs as the units with the scatter between them (one compiled decode_layer
    # copies the cache slice and back)
    assert (len(whole_layers) == 0) == compile


@pytest.mark.parametrize("form, kernel, fallback", [("fused+chain+all", "qkv_rope", "units+attn"),
                                                   ("gemm+attention", "depth_attention", "gemm")])
def test_a_kernel_form_falls_back_when_its_kernels_fail(model, request_for, monkeypatch, form, kernel, fallback):
    """A form whose kernel cannot be built on this device (here: raises) leaves the compiled step of its fallback
    form ("fused+chain+all" -> units+attn, "gemm+attention" -> gemm), not the uncompiled one, and says why; the
    frames stay the eager reference's."""
    settings = COMPILED.with_changes(form=form)

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this device")

    monkeypatch.setattr(fused, kernel, broken)
    request = request_for(model, True, frames=2)
    eager = list(EagerFrameGenerator(model, request, "cpu"))
    clear_runners()
    runner = acquire_runner(model.lm, 2, model.generation_defaults.max_sequence, torch.device("cpu"), settings)
    assert runner.compiled and runner.step.form.name == fallback
    assert "no kernel for this device" in runner.compile_fallback_reason
    assert f"trying form {fallback}" in runner.compile_fallback_reason
    release_runner(model.lm, runner)
    fast = list(FastFrameGenerator(model, request, "cpu", settings=settings))
    clear_runners()
    assert _equal(eager, fast)


def test_depth_head_kernel_form_gives_the_same_frames(model, request_for, monkeypatch):
    """In the `fused+chain+all` form every depth position's logits come from fused.depth_head (its torch form on
    the CPU, where the kernel is not wanted unless forced) and the frames stay the eager reference's."""
    settings = COMPILED.with_changes(form="fused+chain+all")
    assert not fused.depth_head_wanted(torch.device("cpu"), 1024)
    monkeypatch.setattr(fused, "depth_head_wanted", lambda device, hidden, kernels: True)
    calls = []
    real = fused.depth_head
    monkeypatch.setattr(fused, "depth_head", lambda *a, **k: calls.append(1) or real(*a, **k))
    request = request_for(model, True, frames=3)
    eager = list(EagerFrameGenerator(model, request, "cpu"))
    clear_runners()
    gen = FastFrameGenerator(model, request, "cpu", settings=settings)
    fast = list(gen)
    clear_runners()
    assert _equal(eager, fast)
    assert len(calls) >= 3 * (model.lm.config.num_codebooks - 1)  # 15 positions a frame (plus the warm-up's)
