"""Our transformer blocks against transformers' own Qwen3 / Llama / T5Gemma2 on the same random weights (FP32)."""

from __future__ import annotations

import pytest
import torch

from breeze_worker.model.lm.backbone import Backbone
from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.lm.depth_decoder import DepthDecoderModel
from breeze_worker.model.lm.layers import KVCache, additive_mask
from breeze_worker.model.lm.text_encoder import TextEncoder

ATOL = 2e-5


def _randomize(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def _load(hf_module: torch.nn.Module, ours: torch.nn.Module) -> None:
    missing, unexpected = hf_module.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected, unexpected
    assert all(name.startswith("embed_tokens") for name in missing), missing


@pytest.fixture(scope="module")
def config() -> BreezeConfig:
    return BreezeConfig.tiny()


def test_backbone_matches_qwen3(config):
    from transformers import Qwen3Config, Qwen3Model

    c = config.backbone
    hf_config = Qwen3Config(
        vocab_size=8, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta}, attn_implementation="eager",
    )
    hf = Qwen3Model(hf_config).eval()
    ours = Backbone(c).eval()
    _randomize(ours, 1)
    _load(hf, ours)

    # two rows, the second left padded by 3: positions count valid tokens, padding keys are masked
    length, pad = 9, 3
    embeds = torch.randn(2, length, c.hidden_size, generator=torch.Generator().manual_seed(2))
    valid = torch.ones(2, length, dtype=torch.int64)
    valid[1, :pad] = 0
    positions = (valid.cumsum(-1) - 1).masked_fill(valid == 0, 1)
    with torch.no_grad():
        want = hf(inputs_embeds=embeds, attention_mask=valid, position_ids=positions).last_hidden_state
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        allowed = causal[None, None] & valid.bool()[:, None, None, :]
        got = ours(embeds, positions, additive_mask(allowed, torch.float32), KVCache(c.num_hidden_layers))
    assert torch.allclose(got[0], want[0], atol=ATOL)
    assert torch.allclose(got[1, pad:], want[1, pad:], atol=ATOL)

    # incremental: prefill 6 tokens then one step at a time through the cache gives the same states
    with torch.no_grad():
        cache = KVCache(c.num_hidden_layers)
        row = embeds[:1]
        pos = torch.arange(length)[None]
        first = ours(row[:, :6], pos[:, :6], additive_mask(causal[:6, :6][None, None], torch.float32), cache)
        steps = [ours(row[:, t : t + 1], pos[:, t : t + 1], None, cache) for t in range(6, length)]
    assert torch.allclose(torch.cat([first, *steps], dim=1), want[:1], atol=ATOL)


def test_depth_decoder_matches_llama_with_llama3_rope(config):
    from transformers import LlamaConfig, LlamaModel

    c = config.depth
    hf_config = LlamaConfig(
        vocab_size=8, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
        rope_parameters={"rope_theta": c.rope_theta, **c.rope_scaling}, attn_implementation="eager",
    )
    hf = LlamaModel(hf_config).eval()
    ours = DepthDecoderModel(c, num_codebooks=16, vocab_size=2051).eval()
    _randomize(ours, 3)
    state = {k: v for k, v in ours.state_dict().items() if not k.startswith(("inputs_embeds_projector", "embed"))}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all(m.startswith("embed_tokens") for m in missing)
    assert torch.allclose(hf.rotary_emb.inv_freq, ours.rotary.inv_freq)

    inputs = torch.randn(2, 16, c.backbone_hidden_size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = hf(inputs_embeds=ours.inputs_embeds_projector(inputs)).last_hidden_state
        cache = KVCache(c.num_hidden_layers)
        causal = torch.ones(2, 2, dtype=torch.bool).tril()[None, None]
        got = [ours(inputs[:, :2], torch.arange(2), additive_mask(causal, torch.float32), cache)]
        got += [ours(inputs[:, p : p + 1], torch.tensor([p]), None, cache) for p in range(2, 16)]
    assert torch.allclose(torch.cat(got, dim=1), want, atol=ATOL)


def test_llama3_inv_freq_at_full_size_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from breeze_worker.model.lm.rope import default_inv_freq, llama3_inv_freq

    full = BreezeConfig.full_size().depth
    hf_config = LlamaConfig(hidden_size=full.hidden_size, num_attention_heads=full.num_attention_heads,
                            head_dim=full.head_dim, max_position_embeddings=full.max_position_embeddings,
                            rope_parameters={"rope_theta": full.rope_theta, **full.rope_scaling})
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, None)
    got = llama3_inv_freq(full.head_dim, full.rope_theta, full.rope_scaling)
    assert torch.equal(got, want)
    assert not torch.allclose(got, default_inv_freq(full.head_dim, full.rope_theta))  # the scaling is live


@pytest.mark.parametrize("padded", [False, True])
def test_text_encoder_matches_t5gemma2(config, padded):
    from transformers.models.t5gemma2.configuration_t5gemma2 import T5Gemma2TextConfig
    from transformers.models.t5gemma2.modeling_t5gemma2 import T5Gemma2TextEncoder

    c = config.text_encoder
    hf_config = T5Gemma2TextConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, layer_types=list(c.layer_types),
        sliding_window=c.sliding_window, query_pre_attn_scalar=int(c.query_pre_attn_scalar),
        rope_parameters={k: dict(v) for k, v in c.rope_parameters.items()}, rms_norm_eps=c.rms_norm_eps,
        attn_implementation="eager",
    )
    hf_config.dropout_rate = 0.0  # read by the module, not declared by this config class
    hf = T5Gemma2TextEncoder(hf_config, eoi_token_index=c.eoi_token_index).eval()
    ours = TextEncoder(c).eval()
    _randomize(ours, 5)
    missing, unexpected = hf.load_state_dict(ours.state_dict(), strict=True)
    assert not missing and not unexpected

    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(3, c.vocab_size, (2, 15), generator=gen)
    ids[0, 4] = c.eoi_token_index  # replaced by the learned eoi embedding
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 11:] = 0
        ids[1, 11:] = c.pad_token_id
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(ids, mask)
    assert torch.allclose(got[0], want[0], atol=ATOL)
    assert torch.allclose(got[1, :11], want[1, :11], atol=ATOL)
    # the window matters at this length (w=6 over 15 tokens): a full-attention-only encoder differs
    assert c.sliding_window < 15


def test_text_encoder_segments_are_independent_of_padding(config):
    ours = TextEncoder(config.text_encoder).eval()
    _randomize(ours, 7)
    ids = torch.randint(3, 200, (1, 5), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        alone = ours(ids, torch.ones_like(ids))
        padded_ids = torch.cat([ids, torch.zeros(1, 4, dtype=torch.int64)], dim=1)
        padded_mask = torch.cat([torch.ones(1, 5, dtype=torch.int64), torch.zeros(1, 4, dtype=torch.int64)], dim=1)
        padded = ours(padded_ids, padded_mask)
    assert torch.allclose(alone, padded[:, :5], atol=ATOL)
