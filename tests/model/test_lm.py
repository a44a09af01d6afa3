"""BreezeLM wiring: the tied audio embedding, summed frame embeddings, the depth head index, FP32 logits,
and the tiny default."""

from __future__ import annotations

import torch

from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.tiny import tiny_model


def test_audio_embedding_is_tied_to_the_depth_decoder(tiny):
    lm = tiny.lm
    assert lm.embed_audio_tokens is lm.depth_decoder.model.embed_tokens
    names = [n for n, _ in lm.named_parameters()]
    assert "depth_decoder.model.embed_tokens.weight" in names
    assert not any("embed_audio_tokens" in n for n in names)  # stored once


def test_frame_embedding_is_the_sum_over_codebooks(tiny):
    lm, vocab = tiny.lm, tiny.config.vocab_size
    codes = torch.randint(0, 2048, (3, 16), generator=torch.Generator().manual_seed(0))
    table = lm.depth_decoder.model.embed_tokens.weight
    want = torch.stack([sum(table[int(c) + vocab * k] for k, c in enumerate(row)) for row in codes])
    assert torch.allclose(lm.embed_frames(codes), want, atol=1e-6)


def test_depth_head_index_is_the_cache_position_minus_one(tiny):
    lm = tiny.lm
    hidden = torch.randn(2, tiny.config.depth.hidden_size)
    weight = lm.depth_decoder.codebooks_head.weight
    for position in (1, 2, 15):
        got = lm.depth_logits(hidden, position)
        assert got.dtype == torch.float32 and got.shape == (2, 2051)
        assert torch.allclose(got, hidden @ weight[position - 1], atol=1e-6)


def test_depth_inputs_offset_each_codebook(tiny):
    lm, vocab = tiny.lm, tiny.config.vocab_size
    codes = torch.tensor([5, 9])
    table = lm.depth_decoder.model.embed_tokens.weight
    assert torch.equal(lm.depth_decoder.code_embedding(codes, 3), table[codes + 3 * vocab])
    hidden = torch.randn(2, tiny.config.hidden_size)
    prefill = lm.depth_prefill_inputs(hidden, codes)
    assert torch.equal(prefill[:, 0], hidden) and torch.equal(prefill[:, 1], table[codes])


def test_logits_are_fp32_in_a_bf16_model():
    model = tiny_model(seed=0, dtype=torch.bfloat16, with_codec=False)
    hidden = torch.randn(2, model.config.hidden_size, dtype=torch.bfloat16)
    logits = model.lm.backbone_logits(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (2, 2052)
    assert model.lm.backbone_model.rotary.inv_freq.dtype == torch.float32
    assert model.lm.depth_logits(torch.randn(2, 32, dtype=torch.bfloat16), 1).dtype == torch.float32


def test_tiny_default_is_small_seeded_and_the_same_architecture():
    a = tiny_model(seed=0, with_codec=False)
    assert sum(p.numel() for p in a.lm.parameters()) < 5_000_000  # small enough to build at every start
    b, c = tiny_model(seed=0, with_codec=False), tiny_model(seed=1, with_codec=False)
    wa, wb, wc = (m.lm.lm_head.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.is_tiny_default and a.generation_defaults.max_frames == 1500
    full = BreezeConfig.full_size()
    assert (a.config.num_codebooks, a.config.vocab_size) == (full.num_codebooks, full.vocab_size)
    assert a.config.text_encoder.layer_types.count("full_attention") >= 1
    assert a.tokenizer.vocab_size < 400


def test_full_size_config_has_the_released_sizes():
    with torch.device("meta"):
        from breeze_worker.model.lm.breeze import BreezeLM

        lm = BreezeLM(BreezeConfig.full_size())
    live = sum(p.numel() for p in lm.parameters())
    assert 2.80e9 < live < 2.90e9  # ~2.85 B live parameters
    assert lm.depth_decoder.codebooks_head.weight.shape == (15, 1024, 2051)
    assert lm.depth_decoder.model.embed_tokens.weight.shape == (16 * 2051, 2048)
