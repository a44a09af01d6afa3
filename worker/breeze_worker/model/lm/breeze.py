"""BreezeLM: text encoder -> projection -> Qwen3 backbone (codebook 0) -> depth decoder (codebooks 1..15).

Module names follow the official checkpoint (`text_encoder.*`, `text_encoder_proj`, `backbone_model.*`,
`lm_head`, `depth_decoder.model.*`, `depth_decoder.codebooks_head`). The backbone's audio embedding is the
depth decoder's `embed_tokens` (tied; only that copy exists): a frame embeds as
sum_k E[code_k + vocab * k]. Logits (lm_head and codebook heads) are computed in FP32.

This module holds no decoding policy: the eager generator (engine/eager.py) and the fast path drive
these methods with their own caches (see the KV-cache protocol in layers.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from breeze_worker.model.lm.backbone import Backbone
from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.lm.depth_decoder import DepthDecoder
from breeze_worker.model.lm.layers import KVCache
from breeze_worker.model.lm.rope import RotaryEmbedding
from breeze_worker.model.lm.text_encoder import TextEncoder


class BreezeLM(nn.Module):
    codebook_offsets: torch.Tensor  # a non-persistent buffer: codebook index * vocab_size

    def __init__(self, config: BreezeConfig):
        super().__init__()
        self.config = config
        self.text_encoder = TextEncoder(config.text_encoder)
        self.text_encoder_proj = nn.Linear(config.text_encoder.hidden_size, config.hidden_size, bias=False)
        self.backbone_model = Backbone(config.backbone)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size + 1, bias=False)
        self.depth_decoder = DepthDecoder(config.depth, config.num_codebooks, config.vocab_size)
        self.register_buffer("codebook_offsets", self._offsets(), persistent=False)

    def _offsets(self) -> torch.Tensor:
        # on the CPU under any default device (rope.py `default_inv_freq` says why); moved with the module
        return torch.arange(self.config.num_codebooks, dtype=torch.int64, device="cpu") * self.config.vocab_size

    @property
    def embed_audio_tokens(self) -> nn.Embedding:
        """The backbone's audio embedding: tied to (the same module as) the depth decoder's embed_tokens."""
        return self.depth_decoder.model.embed_tokens

    def reset_buffers(self) -> None:
        """Recompute non-persistent buffers (after materializing a meta-device model)."""
        for module in self.modules():
            if isinstance(module, RotaryEmbedding):
                module.reset_inv_freq()
        self.codebook_offsets = self._offsets().to(self.codebook_offsets.device)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.codebook_offsets = self._offsets().to(self.codebook_offsets.device)
        return self

    # ---- text ----
    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Right-padded segments [S, T] -> projected encoder states [S, T, hidden] (padding rows unused)."""
        return self.text_encoder_proj(self.text_encoder(input_ids, attention_mask))

    def encode_segments(self, segments: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each 1-D token segment encoded on its own (one padded row each) -> [len_i, hidden] per segment."""
        if not segments:
            return []
        states = self.encode_padded(segments)
        return [states[row, : seg.numel()] for row, seg in enumerate(segments)]

    def encode_padded(self, segments: list[torch.Tensor]) -> torch.Tensor:
        """Non-empty list of 1-D token segments, right-padded to the longest -> states [S, longest, hidden]."""
        device = self.lm_head.weight.device
        longest = max(int(s.numel()) for s in segments)
        ids = torch.full((len(segments), longest), self.config.text_encoder.pad_token_id, dtype=torch.int64)
        mask = torch.zeros((len(segments), longest), dtype=torch.int64)
        for row, seg in enumerate(segments):
            ids[row, : seg.numel()] = seg.to(torch.int64).cpu()
            mask[row, : seg.numel()] = 1
        return self.encode_text(ids.to(device), mask.to(device))

    # ---- audio frames ----
    def embed_frames(self, codes: torch.Tensor) -> torch.Tensor:
        """codes int64 [..., num_codebooks] -> summed embedding [..., hidden]."""
        return self.embed_audio_tokens(codes + self.codebook_offsets).sum(dim=-2)

    # ---- backbone ----
    def new_backbone_cache(self) -> KVCache:
        return KVCache(self.config.backbone.num_hidden_layers)

    def backbone(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor | None,
                 cache) -> torch.Tensor:
        return self.backbone_model(inputs_embeds, positions, attention_mask, cache)

    def backbone_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> FP32 logits [..., vocab + 1] (the last class is end of speech)."""
        return F.linear(hidden.float(), self.lm_head.weight.float())

    # ---- depth decoder ----
    def new_depth_cache(self) -> KVCache:
        return KVCache(self.config.depth.num_hidden_layers)

    def depth_prefill_inputs(self, backbone_hidden: torch.Tensor, codebook0: torch.Tensor) -> torch.Tensor:
        """[R, H] last backbone state and [R] codebook-0 codes -> depth inputs [R, 2, H] (unprojected)."""
        first = self.depth_decoder.code_embedding(codebook0, 0)
        return torch.stack((backbone_hidden.to(first.dtype), first), dim=1)

    def depth_logits(self, depth_hidden: torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
        """Depth hidden [R, H] at cache position p (>= 1) -> FP32 logits [R, vocab] of codebook p."""
        return self.depth_decoder.codebooks_head(depth_hidden, position - 1)
