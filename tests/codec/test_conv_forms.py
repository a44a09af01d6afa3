"""The codec's convolutions as one GEMM (model/codec/layers.py `conv1d_as_gemm`) compute what the library's
convolution computes, and the per-shape tuner (engine/codec_graphs.py `tune_convolutions`) routes shapes
without changing the decoded audio."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from breeze_worker.engine.codec_graphs import tune_convolutions
from breeze_worker.model.codec.layers import (
    CausalConv1d,
    CausalTransposedConv1d,
    conv1d_as_gemm,
    conv_transpose1d_as_gemm,
)

TUNABLE = (CausalConv1d, CausalTransposedConv1d)


def random_codes(batch: int, frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (batch, 16, frames), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("batch, c_in, c_out, kernel, dilation, bias",
                         [(3, 8, 5, 7, 3, True), (1, 4, 4, 1, 1, True), (2, 6, 1, 7, 1, False), (4, 5, 7, 3, 9, True)])
def test_gemm_form_equals_library_convolution(batch, c_in, c_out, kernel, dilation, bias):
    generator = torch.Generator().manual_seed(kernel * 100 + dilation)
    x = torch.randn(batch, c_in, 60, generator=generator)
    weight = torch.randn(c_out, c_in, kernel, generator=generator)
    b = torch.randn(c_out, generator=generator) if bias else None
    expected = F.conv1d(x, weight, b, dilation=dilation)
    got = conv1d_as_gemm(x, weight, b, dilation)
    assert got.shape == expected.shape and got.is_contiguous()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch, c_in, c_out, stride, multiple, bias",
                         [(3, 6, 4, 4, 2, True), (2, 5, 3, 3, 1, True), (1, 4, 2, 2, 3, False)])
def test_transposed_gemm_form_equals_library_convolution(batch, c_in, c_out, stride, multiple, bias):
    generator = torch.Generator().manual_seed(stride * 10 + multiple)
    x = torch.randn(batch, c_in, 9, generator=generator)
    weight = torch.randn(c_in, c_out, stride * multiple, generator=generator)
    b = torch.randn(c_out, generator=generator) if bias else None
    expected = F.conv_transpose1d(x, weight, b, stride=stride)
    got = conv_transpose1d_as_gemm(x, weight, b, stride)
    assert got.shape == expected.shape and got.is_contiguous()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_causal_conv_routes_only_listed_shapes():
    conv = CausalConv1d(4, 3, kernel_size=7, dilation=3)
    x = torch.randn(2, 4, 30)
    calls = []
    conv.conv.register_forward_hook(lambda *_: calls.append("library"))
    conv.convolve(x)
    assert calls == ["library"]
    conv.set_form(tuple(x.shape), gemm=True)
    out = conv.convolve(x)
    assert calls == ["library"]  # the GEMM form did not call the library's module
    torch.testing.assert_close(out, conv.conv(x), atol=1e-5, rtol=1e-5)
    conv.convolve(torch.randn(1, 4, 30))  # another shape: the library again
    assert calls == ["library", "library", "library"]


def test_tuner_reports_every_one_group_convolution_and_keeps_the_audio(codec):
    """Convolutions and transposed convolutions alike; depthwise convolutions stay with the library."""
    decoder = copy.deepcopy(codec.decoder)  # the session's codec stays untouched
    state = decoder.new_stream(2)
    codes = random_codes(2, 1, seed=3)
    report = tune_convolutions(decoder, lambda: decoder.decode_stream(codes, state), repeats=1)
    modules = dict(decoder.named_modules())
    one_group = [m for m in decoder.modules() if isinstance(m, TUNABLE) and m.gemm_capable]
    grouped = [m for m in decoder.modules() if isinstance(m, CausalConv1d) and not m.gemm_capable]
    assert grouped, "the decoder's depthwise convolutions should be left to the library"
    assert any(isinstance(m, CausalTransposedConv1d) for m in one_group)
    assert sorted(r["conv"] for r in report) == sorted(n for n, m in modules.items() if m in one_group)
    assert all(r["relative_diff"] < 1e-4 for r in report)
    assert all(r["shape"][0] == 2 for r in report)
    assert sum(len(m.gemm_shapes) for m in one_group) == sum(r["gemm"] for r in report)

    # the recorded shape is the one a step gives each convolution (seen with every module on the library)
    for m in one_group:
        m.gemm_shapes = {}
    seen = {}

    def record(name):
        def hook(_module, args):
            seen.setdefault(name, tuple(args[0].shape))  # returns None: the arguments stay as they are
        return hook

    hooks = [modules[r["conv"]].conv.register_forward_pre_hook(record(r["conv"])) for r in report]
    decoder.decode_stream(codes, decoder.new_stream(2))
    for hook in hooks:
        hook.remove()
    assert all(seen[r["conv"]] == tuple(r["shape"]) for r in report)

    # every convolution as a GEMM, then none: the streamed audio agrees within FP32 rounding
    for r in report:
        modules[r["conv"]].gemm_shapes = {tuple(r["shape"]): True}
    library_calls = []
    probes = [m.conv.register_forward_hook(lambda *_: library_calls.append(1)) for m in one_group]
    frames = random_codes(2, 4, seed=5)
    as_gemm, state = [], decoder.new_stream(2)
    for t in range(4):
        as_gemm.append(decoder.decode_stream(frames[:, :, t: t + 1], state))
    assert not library_calls  # every tunable convolution ran as a GEMM
    for probe in probes:
        probe.remove()
    for m in one_group:
        m.gemm_shapes = {}
    library, state = [], decoder.new_stream(2)
    for t in range(4):
        library.append(decoder.decode_stream(frames[:, :, t: t + 1], state))
    assert torch.cat(library, -1).abs().mean() > 0.01
    torch.testing.assert_close(torch.cat(as_gemm, -1), torch.cat(library, -1), atol=1e-5, rtol=0)
