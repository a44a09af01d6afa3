"""The codec's convolutions as one GEMM (model/codec/layers.py `conv1d_as_gemm`) compute what the library's
convolution computes, and the per-shape tuner (engine/codec_graphs.py `tune_convolutions`) routes shapes
without changing the decoded audio."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import torch
import torch.nn.functional as F

from breeze_worker.engine.codec_graphs import FormStore, tune_convolutions
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


def _tune(codec, store):
    decoder = copy.deepcopy(codec.decoder)  # forms live on the modules: a fresh copy starts with none
    state = decoder.new_stream(2)
    report = tune_convolutions(decoder, lambda: decoder.decode_stream(random_codes(2, 1, seed=3), state),
                               repeats=1, store=store)
    return decoder, report


def test_forms_are_kept_per_host_and_the_next_start_takes_them_untimed(codec, tmp_path, monkeypatch):
    """A store's file holds every choice a tuning made; a later start (a new store on the same file, a new
    decoder) takes the file's choices without timing anything, whatever a timing would have said, and still
    checks each GEMM's output."""
    from breeze_worker.engine import codec_graphs

    store = FormStore.for_decoder(codec.decoder, tf32=False, directory=tmp_path)
    _, first = _tune(codec, store)
    assert first and not any(r["stored"] for r in first) and all(r["library_us"] is not None for r in first)
    doc = json.loads(store.path.read_text())
    assert doc["identity"]["tf32"] is False and len(doc["forms"]) == len(first)
    assert {f"{r['conv']}|{','.join(map(str, r['shape']))}" for r in first} == set(doc["forms"])

    # every form flipped to the GEMM in the file: the next start follows the file, not a measurement
    doc["forms"] = {key: True for key in doc["forms"]}
    store.path.write_text(json.dumps(doc))

    def no_timing(*_args, **_kwargs):
        raise AssertionError("a stored form was timed again")

    monkeypatch.setattr(codec_graphs, "_time_us", no_timing)
    decoder, again = _tune(codec, FormStore.for_decoder(codec.decoder, tf32=False, directory=tmp_path))
    assert all(r["stored"] and r["gemm"] and r["library_us"] is None for r in again)
    modules = dict(decoder.named_modules())
    assert all(tuple(r["shape"]) in modules[r["conv"]].gemm_shapes for r in again)


def test_a_store_is_one_per_precision_and_device_and_survives_a_bad_file(codec, tmp_path, caplog):
    """TF32 and strict FP32 keep separate files; a file of another identity, or an unreadable one, is timed
    again and rewritten; a directory that cannot be written costs only the timing."""
    fp32 = FormStore.for_decoder(codec.decoder, tf32=False, directory=tmp_path)
    tf32 = FormStore.for_decoder(codec.decoder, tf32=True, directory=tmp_path)
    assert fp32.path != tf32.path and fp32.identity["device"] == "cpu"

    tf32.path.write_text(json.dumps({"identity": fp32.identity, "forms": {"x|1": True}}))  # not its own
    _, report = _tune(codec, FormStore.for_decoder(codec.decoder, tf32=True, directory=tmp_path))
    assert not any(r["stored"] for r in report)
    assert json.loads(tf32.path.read_text())["identity"]["tf32"] is True

    fp32.path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="breeze_worker.engine.codec_graphs"):
        _, report = _tune(codec, FormStore.for_decoder(codec.decoder, tf32=False, directory=tmp_path))
    assert not any(r["stored"] for r in report) and "unreadable" in caplog.text
    assert len(json.loads(fp32.path.read_text())["forms"]) == len(report)

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="breeze_worker.engine.codec_graphs"):
        _, report = _tune(codec, FormStore.for_decoder(codec.decoder, tf32=False, directory=blocked / "forms"))
    assert report and "could not keep" in caplog.text


def test_forms_live_in_inductors_cache_directory(tmp_path, monkeypatch):
    """Beside the compiled code they go with: where TORCHINDUCTOR_CACHE_DIR points (Inductor's own rule)."""
    from breeze_worker.engine.codec_graphs import forms_directory

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert forms_directory() == tmp_path / "inductor" / "breeze"
