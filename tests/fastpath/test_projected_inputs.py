"""The depth positions' inputs from the table of projected codes (fastpath/step.py `projected_codes`): the
table is the model's embedding times its projector, built once per model and dtype, and the compiled step
gives the eager reference's frames with it (FP32, tiny model)."""

from __future__ import annotations

import torch

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.fastpath.generator import FastFrameGenerator
from breeze_worker.engine.fastpath.graph import clear_runners
from breeze_worker.engine.fastpath.step import projected_codes


def test_the_table_is_the_projected_embedding_once_per_model_and_dtype(model):
    lm = model.lm
    table = projected_codes(lm, torch.float32)
    assert projected_codes(lm, torch.float32) is table  # cached on the model
    vocab = lm.config.vocab_size
    codes = torch.tensor([0, 1, vocab - 1, 17])
    weight = lm.depth_decoder.model.inputs_embeds_projector.weight
    assert len(table) == lm.config.num_codebooks
    for p in (0, 3, lm.config.num_codebooks - 1):
        runtime = lm.depth_decoder.code_embedding(codes, p) @ weight.t()
        assert table[p].shape == (vocab, weight.shape[0]) and table[p].dtype == torch.float32
        torch.testing.assert_close(table[p][codes], runtime, rtol=1e-5, atol=1e-6)
    half = projected_codes(lm, torch.bfloat16)
    assert half[2].dtype == torch.bfloat16 and half is not table
    # rounded once from the exact product: within one BF16 step of the FP32 table
    torch.testing.assert_close(half[2].float(), table[2], rtol=2 ** -8, atol=1e-6)


def test_compiled_frames_come_from_the_table(model, request_for):
    """The compiled step gives the eager reference's frames with its depth inputs from the table; with the table
    zeroed, other frames (so the step did read it)."""
    request = request_for(model, True, frames=3)
    eager = list(EagerFrameGenerator(model, request, "cpu"))
    table = projected_codes(model.lm, torch.float32)

    def frames() -> list[torch.Tensor]:
        clear_runners()
        try:
            settings = FastPathSettings(compile="on", compile_backend="aot_eager")
            return list(FastFrameGenerator(model, request, "cpu", settings=settings))
        finally:
            clear_runners()

    def same(run):
        return len(run) == 3 and all(torch.equal(a, b) for a, b in zip(eager, run))

    assert same(frames())
    saved = [t.clone() for t in table]
    try:
        for t in table:
            t.zero_()
        assert not same(frames())
    finally:
        for t, original in zip(table, saved):
            t.copy_(original)
