"""The depth decoder: a small causal Llama over the 16 codebooks of one frame.

Position 0 holds the backbone's last hidden state, position p >= 1 the embedding of codebook p-1's code,
`embed_tokens[code + (p-1) * vocab]`; every input passes `inputs_embeds_projector` (backbone hidden ->
depth hidden). The hidden state at position p predicts codebook p through `codebooks_head.weight[p-1]`
(the head index is the cache position minus one), so a frame is a 2-position prefill (codebook 1) and 14
one-position steps (codebooks 2..15); the cache restarts every frame. RoPE uses llama3 scaling with the
checkpoint's constants, RMSNorm is plain (w * x), attention is scaled by head_dim^-0.5 with no q/k-norm.
"""

from __future__ import annotations

import torch
from torch import nn

from breeze_worker.model.lm.config import DepthDecoderConfig
from breeze_worker.model.lm.layers import Attention, DecoderLayer, GatedMLP, RMSNorm
from breeze_worker.model.lm.rope import RotaryEmbedding


def llama_layer(config: DepthDecoderConfig, layer_idx: int) -> DecoderLayer:
    c = config
    attention = Attention(layer_idx, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                          scale=c.head_dim**-0.5, bias=c.attention_bias)
    mlp = GatedMLP(c.hidden_size, c.intermediate_size, c.hidden_act, bias=c.mlp_bias)
    return DecoderLayer(attention, mlp, c.hidden_size, c.rms_norm_eps)


class DepthDecoderModel(nn.Module):
    """Checkpoint prefix `depth_decoder.model.`: embed_tokens, inputs_embeds_projector, layers, norm."""

    def __init__(self, config: DepthDecoderConfig, num_codebooks: int, vocab_size: int):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(num_codebooks * vocab_size, config.backbone_hidden_size)
        self.inputs_embeds_projector = nn.Linear(config.backbone_hidden_size, config.hidden_size, bias=False)
        self.layers = nn.ModuleList(llama_layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor | None,
                cache) -> torch.Tensor:
        """inputs_embeds [R, T, backbone_hidden] (unprojected), positions int64 [T] -> hidden [R, T, H]."""
        x = self.inputs_embeds_projector(inputs_embeds)
        rope = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, rope, attention_mask, cache)
        return self.norm(x)


class CodebooksHead(nn.Module):
    """`weight` [num_codebooks - 1, hidden, vocab]: one (hidden, vocab) matrix per depth codebook."""

    def __init__(self, num_codebooks: int, hidden: int, vocab: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_codebooks - 1, hidden, vocab))

    def forward(self, hidden: torch.Tensor, head_index: torch.Tensor | int) -> torch.Tensor:
        """hidden [R, H] at cache position p, head_index = p - 1 -> FP32 logits [R, vocab]."""
        return hidden.float() @ self.weight[head_index].float()


class DepthDecoder(nn.Module):
    def __init__(self, config: DepthDecoderConfig, num_codebooks: int, vocab_size: int):
        super().__init__()
        self.config, self.num_codebooks, self.vocab_size = config, num_codebooks, vocab_size
        self.model = DepthDecoderModel(config, num_codebooks, vocab_size)
        self.codebooks_head = CodebooksHead(num_codebooks, config.hidden_size, vocab_size)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.embed_tokens

    @property
    def inputs_embeds_projector(self) -> nn.Linear:
        return self.model.inputs_embeds_projector

    def code_embedding(self, codes: torch.Tensor, codebook: int | torch.Tensor) -> torch.Tensor:
        """Embedding (backbone hidden size, unprojected) of `codes` [R] of codebook `codebook`."""
        return self.model.embed_tokens(codes + codebook * self.vocab_size)

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor | None,
                cache) -> torch.Tensor:
        return self.model(inputs_embeds, positions, attention_mask, cache)
