"""The compiled codec step (engine/codec_graphs.py, `SlotBatch(compile=True)`) on the CPU.

Dynamo traces it here with the "aot_eager" backend (the whole graph, no code generated): Inductor's C++
code for the tiny codec took 64-103 s per bucket to build on a cold cache (5-11 s warm) on a 2-core CI
machine, too long for a unit test. What is checked is what the backend does not change: the pure step
and its copy-back, one cache per bucket, guards that other buckets' convolution forms leave alone, and
the fallback when compiling fails. BREEZE_TEST_CODEC_COMPILE_BACKEND=inductor runs the same tests through
Inductor's C++ code (the tolerances below hold for it); on a GPU, tests/gpu/test_gpu_codec.py checks the
compiled step's audio against the uncompiled step's.
"""

from __future__ import annotations

import argparse
import logging
import os

import pytest
import torch

from breeze_worker.commands.serve import add_arguments, settings_from_args
from breeze_worker.engine.codec_graphs import (
    SlotBatch,
    clear_convolution_forms,
    decode_step,
    pool_for,
    tune_convolutions,
)
from breeze_worker.model.codec import tiny_codec
from breeze_worker.model.codec.layers import TwoFormConvolution

BACKEND = os.environ.get("BREEZE_TEST_CODEC_COMPILE_BACKEND", "aot_eager")


@pytest.fixture(scope="module")
def codec():
    torch.set_num_threads(1)  # Dynamo guards on the thread count: every step runs with the one it compiled with
    return tiny_codec(seed=0)


@pytest.fixture(scope="module")
def compiled(codec):
    """Compiled batches of 1 and 2 slots, built with Dynamo's recompile limit at 1: sharing one cache, the
    second would be a recompile past it (a whole-graph compile then fails, and the batch falls back)."""
    with torch._dynamo.config.patch(recompile_limit=1):
        return {rows: SlotBatch(codec.decoder, rows, use_graphs=False, compile=True, compile_backend=BACKEND)
                for rows in (1, 2)}


def frames(rows: int, count: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 2048, (rows, 16), generator=generator) for _ in range(count)]


def state_tensors(batch: SlotBatch) -> list[torch.Tensor]:
    s = batch.state
    return [*s.contexts, *s.keys, *s.values, s.position]


def test_each_bucket_compiles_into_a_cache_of_its_own(compiled):
    for rows, batch in compiled.items():
        assert batch.compiled and batch.fallback_reason is None, (rows, batch.fallback_reason)
        assert batch.compile_s > 0 and batch.capture_s == 0.0  # no graph on the CPU


def test_compiled_step_decodes_what_the_uncompiled_one_does(codec, compiled):
    """Five steps of two slots, slot 0 restarted in place after the third (a stream leaving, another joining):
    the same audio every step and the same state after, in the batch's own (static) tensors."""
    batch = compiled[2]
    batch.clear()
    plain = SlotBatch(codec.decoder, 2, use_graphs=False, compile=False)
    assert not plain.compiled
    static = [t.data_ptr() for t in state_tensors(batch)]
    for i, host in enumerate(frames(2, 5, seed=7)):
        if i == 3:
            with torch.inference_mode():
                batch.state.zero_rows_(0)
                plain.state.zero_rows_(0)
        got, want = batch.step(host), plain.step(host)
        assert want.abs().mean() > 0.01
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0, msg=f"step {i}")  # Inductor: <= 5e-6
    assert batch.state.position.tolist() == [2, 5]
    assert [t.data_ptr() for t in state_tensors(batch)] == static
    for mine, theirs in zip(state_tensors(batch), state_tensors(plain), strict=True):
        # contexts up to ~7 in magnitude; Inductor's sums in another order differ by <= 2e-5
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-5)


def test_other_buckets_forms_do_not_recompile_a_compiled_step(codec, compiled):
    """The tuner fills the convolutions' `gemm_shapes` bucket by bucket, after earlier buckets compiled; a
    compiled step must stay valid through that (Dynamo guards only on its own shapes), but not through a
    change of its own forms."""
    batch, decoder = compiled[1], codec.decoder
    host = frames(1, 1, seed=3)[0]
    batch.step(host)
    convolutions = [m for m in decoder.modules() if isinstance(m, TwoFormConvolution)]
    try:
        for m in convolutions:  # another bucket's shapes (batch 2) as GEMMs
            m.set_form((2, m.in_channels, 99), gemm=True)
        with torch.compiler.set_stance("fail_on_recompile"):
            batch.step(host)
        state = batch.state
        report = tune_convolutions(decoder, lambda: decode_step(decoder, batch.codes, state.contexts, state.keys,
                                                                state.values, state.position), repeats=1)
        modules = dict(decoder.named_modules())
        for r in report:  # this bucket's own shapes: the compiled step no longer fits
            modules[r["conv"]].set_form(tuple(r["shape"]), gemm=True)
        with torch.compiler.set_stance("fail_on_recompile"), pytest.raises(RuntimeError, match="recompile"):
            batch.step(host)
    finally:
        clear_convolution_forms(decoder)
        batch.clear()


def test_a_failed_compile_falls_back_to_the_uncompiled_step(codec, caplog):
    def broken(graph, example_inputs):
        raise RuntimeError("no compiler on this host")

    with caplog.at_level(logging.WARNING, logger="breeze_worker.engine.codec_graphs"):
        batch = SlotBatch(codec.decoder, 2, use_graphs=False, compile=True, compile_backend=broken)
    assert not batch.compiled
    assert "torch.compile of the codec step failed" in batch.fallback_reason
    assert "no compiler on this host" in batch.fallback_reason
    assert any("no compiler on this host" in r.getMessage() for r in caplog.records)
    plain = SlotBatch(codec.decoder, 2, use_graphs=False, compile=False)
    for host in frames(2, 2, seed=11):
        assert torch.equal(batch.step(host), plain.step(host))


def test_compile_follows_the_codec_compile_slots_setting(codec, monkeypatch):
    """The batch, the pool and the runtime take the `codec_compile_slots` setting explicitly
    (--codec-compile-slots or BREEZE_ENGINE_CODEC_COMPILE_SLOTS, read by the command; 16 by default, on CUDA
    only); the environment is not consulted below the command."""
    from breeze_worker.engine.codec_graphs import SlotPool
    from breeze_worker.engine.runtime import codec_compile_slots

    compiles = []
    monkeypatch.setattr(SlotBatch, "_compile", lambda self: compiles.append(self.rows))
    monkeypatch.setenv("BREEZE_ENGINE_CODEC_COMPILE_SLOTS", "1")  # read by the command's settings, not here
    assert not SlotBatch(codec.decoder, 1, use_graphs=False).compile and compiles == []
    assert SlotBatch(codec.decoder, 2, use_graphs=False, compile=True).compile and compiles == [2]
    pool = SlotPool(codec.decoder, compile_from=4)
    assert [pool.compiles(rows) for rows in (1, 2, 4, 8, 64)] == [False, False, True, True, True]
    assert not any(SlotPool(codec.decoder).compiles(rows) for rows in (1, 16, 64))

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    default = settings_from_args(parser.parse_args([]), environ={}).engine
    assert default.codec_compile_slots == 16
    off = settings_from_args(parser.parse_args(["--codec-compile-slots", "0"]), environ={}).engine
    assert off.codec_compile_slots == 0
    assert settings_from_args(parser.parse_args([]), environ=None).engine.codec_compile_slots == 1  # the process's
    assert codec_compile_slots(default, torch.device("cuda")) == 16
    assert codec_compile_slots(default, torch.device("cpu")) == 0  # no Inductor C++ build on a CPU worker


def test_the_pool_builds_batches_as_asked(monkeypatch):
    """pool_for(codec, compile_from=...) (the runtime's warm-up) builds the batches of that many rows and more
    compiled; a later pool_for(codec) (the engine's CodecRows) keeps the pool and its batches."""
    codec = tiny_codec(seed=1)
    built = []
    monkeypatch.setattr(SlotBatch, "_compile", lambda self: built.append(self.rows))
    pool = pool_for(codec, compile_from=2)
    assert pool.compile_from == 2 and pool_for(codec) is pool
    small, batch = pool.acquire(1), pool.acquire(2)
    assert not small.compile and batch.compile and built == [2]
    pool.release(batch)
    assert pool_for(codec, compile_from=2) is pool and pool_for(codec).acquire(2) is batch
    assert pool_for(codec, compile_from=0) is not pool and pool_for(codec).compile_from == 0
