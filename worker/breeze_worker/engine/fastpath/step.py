"""The frame step of the fast path, built around rows.

A *row* is one model row (one per stream, two for a CFG stream: cond and uncond); a *stream* is one
request. `FrameStep` owns every buffer a frame reads or writes (static caches, logits, codes, flags), so
its two halves can be captured as CUDA graphs and replayed with no host work in between:

- `sample_frame()`: codebook 0 from the pending backbone logits (CFG combination, repetition penalty on the
  codebook-0 history, reserved ids masked, temperature / top-k / top-p, exponential race), then the depth
  decoder's 2-position prefill and 14 one-position steps, each with its own sampling. It writes the packed
  host-read buffer `readout` [streams, 18] = 16 codes, end-of-speech flag, non-finite flag.
- `backbone_step(bucket)`: feeds the frame's summed embedding to the backbone (one position per row, written
  at each row's `write_pos`, attending over the first `bucket` slots) and leaves the next frame's logits.

Several streams can share one step (a later batching issue): rows `cond_row[s]`, `uncond_row[s]` of stream
`s` are combined `u + scale * (c - u)`; a stream without CFG has cond_row == uncond_row (exactly c).
Sampling noise is keyed by (seed, frame, codebook) per stream, so the result does not depend on the row
layout. The computation per row is the eager reference's (engine/eager.py), re-expressed with packed GEMMs.
"""

from __future__ import annotations

import torch

from breeze_worker.engine.fastpath.layers import PackedLayer, linear, rms_norm
from breeze_worker.engine.fastpath.static_cache import BackboneCache, DepthCache
from breeze_worker.engine.sampling import RowSampling, apply_repetition_penalty, frame_noise, sample_rows

READOUT_EOS, READOUT_NONFINITE = 16, 17  # columns of `readout` after the 16 codes


def packed_layers(lm) -> tuple[list[PackedLayer], list[PackedLayer]]:
    """Pack the model's layers once per model (the packing re-points module weights at packed tensors)."""
    packed = getattr(lm, "_fastpath_packed", None)
    if packed is None:
        packed = ([PackedLayer(layer) for layer in lm.backbone_model.layers],
                  [PackedLayer(layer) for layer in lm.depth_decoder.model.layers])
        lm._fastpath_packed = packed
    return packed


class FrameStep:
    def __init__(self, lm, rows: int, streams: int, capacity: int, device: torch.device):
        cfg = lm.config
        self.lm, self.rows, self.streams, self.device = lm, rows, streams, device
        self.backbone_layers, self.depth_layers = packed_layers(lm)
        self.codebooks, self.vocab = cfg.num_codebooks, cfg.vocab_size
        dtype = lm.embed_audio_tokens.weight.dtype  # the residual stream's dtype
        self.dtype = dtype
        bb, dd = cfg.backbone, cfg.depth
        kv_dtype = _kv_dtype(lm)
        self.cache = BackboneCache.allocate(bb.num_hidden_layers, rows, bb.num_key_value_heads, bb.head_dim,
                                            capacity, kv_dtype, device)
        self.depth_cache = DepthCache.allocate(dd.num_hidden_layers, rows, dd.num_key_value_heads, dd.head_dim,
                                               self.codebooks, kv_dtype, device)
        # depth RoPE: positions 0..15 are the same every frame
        cos, sin = lm.depth_decoder.model.rotary(torch.arange(self.codebooks, device=device), kv_dtype)
        self.depth_cos, self.depth_sin = cos[None, None], sin[None, None]  # [1, 1, 16, D]
        causal = torch.ones(2, 2, dtype=torch.bool, device=device).tril()
        self.depth_prefill_mask = torch.where(causal, 0.0, torch.finfo(torch.float32).min)[None, None]
        # per-row and per-stream state
        z = dict(device=device)
        self.hidden = torch.zeros(rows, bb.hidden_size, dtype=dtype, **z)  # last backbone state per row
        self.logits = torch.zeros(rows, self.vocab + 1, dtype=torch.float32, **z)  # pending codebook-0 logits
        self.row_stream = torch.zeros(rows, dtype=torch.int64, **z)
        self.cond_row = torch.zeros(streams, dtype=torch.int64, **z)
        self.uncond_row = torch.zeros(streams, dtype=torch.int64, **z)
        self.cfg_scale = torch.ones(streams, dtype=torch.float32, **z)
        self.frame = torch.zeros(streams, dtype=torch.int64, **z)
        self.seen = torch.zeros(streams, self.vocab + 1, dtype=torch.bool, **z)  # codebook-0 history
        self.sampling = RowSampling(
            temperature=torch.ones(streams, **z), top_k=torch.zeros(streams, dtype=torch.int64, **z),
            top_p=torch.ones(streams, **z), repetition_penalty=torch.ones(streams, **z),
            seed=torch.zeros(streams, dtype=torch.int64, **z))
        self.eos_masked = torch.zeros(streams, dtype=torch.bool, **z)  # bench: end of speech not allowed
        self.codes = torch.zeros(streams, self.codebooks, dtype=torch.int64, **z)
        self.nonfinite = torch.zeros(streams, dtype=torch.bool, **z)
        self.readout = torch.zeros(streams, self.codebooks + 2, dtype=torch.int64, **z)
        reserved = torch.zeros(self.vocab + 1, dtype=torch.bool, **z)
        reserved[list(cfg.reserved_code_ids)] = True
        self.blocked0 = reserved  # backbone classes: codes, reserved, end of speech (last)
        self.blocked_depth = reserved[: self.vocab].clone()
        self.eos_column = torch.zeros(self.vocab + 1, dtype=torch.bool, **z)
        self.eos_column[cfg.end_of_speech_id] = True

    # ---- stream setup (host side, outside graphs) ----
    def set_stream(self, stream: int, cond_row: int, uncond_row: int, cfg_scale: float, sampling: RowSampling,
                   eos_masked: bool = False) -> None:
        self.cond_row[stream], self.uncond_row[stream] = cond_row, uncond_row
        self.row_stream[cond_row] = stream
        self.row_stream[uncond_row] = stream
        self.cfg_scale[stream] = cfg_scale
        for name in ("temperature", "top_k", "top_p", "repetition_penalty", "seed"):
            getattr(self.sampling, name)[stream] = getattr(sampling, name)[0]
        self.frame[stream] = 0
        self.seen[stream] = False
        self.eos_masked[stream] = eos_masked

    @torch.no_grad()
    def prefill(self, rows: slice, embeds: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor) -> None:
        """Run the prompt `embeds` [r, T, H] (left-padded; `allowed` bool [r, T] False on padding, RoPE
        `positions` [r, T]) through the backbone into cache rows `rows`; leaves the first frame's logits."""
        r, t, _ = embeds.shape
        cache = self.cache
        cache.valid[rows] = False
        cache.valid[rows, :t] = allowed
        causal = torch.ones(t, t, dtype=torch.bool, device=self.device).tril()
        mask = torch.where(causal[None] & allowed[:, None, :], 0.0, torch.finfo(torch.float32).min)[:, None]
        cos, sin = self.lm.backbone_model.rotary(positions, self.cache.key.dtype)
        cos, sin = cos[:, None], sin[:, None]
        x = embeds.to(self.dtype)
        for i, layer in enumerate(self.backbone_layers):
            def write(k, v, i=i):
                cache.key[i, rows, :, :t] = k
                cache.value[i, rows, :, :t] = v

            def read(i=i):
                return cache.key[i, rows, :, :t], cache.value[i, rows, :, :t]

            x = layer.forward(x, cos, sin, write, read, mask)
        last = self.lm.backbone_model.norm(x[:, -1])
        self.hidden[rows] = last
        self.logits[rows] = self.lm.backbone_logits(last)
        cache.write_pos[rows] = t
        cache.rope_pos[rows] = positions[:, -1] + 1

    # ---- the two graph-captured halves ----
    def _combine(self, logits: torch.Tensor) -> torch.Tensor:
        """Row logits [R, V] -> stream logits [S, V]: u + scale * (c - u)."""
        cond, uncond = logits[self.cond_row], logits[self.uncond_row]
        return uncond + self.cfg_scale[:, None] * (cond - uncond)

    def _pick(self, logits: torch.Tensor, codebook: int, noise: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
        self.nonfinite |= ~torch.isfinite(logits).all(dim=-1)
        return sample_rows(logits, self.sampling, self.frame, codebook, blocked, noise=noise)

    @torch.no_grad()
    def sample_frame(self) -> None:
        lm, rows = self.lm, self.rows
        self.nonfinite.zero_()
        noise = frame_noise(self.sampling.seed, self.frame, self.codebooks, self.vocab + 1)
        logits0 = apply_repetition_penalty(self._combine(self.logits), self.seen, self.sampling.repetition_penalty)
        logits0 = logits0.masked_fill(self.eos_masked[:, None] & self.eos_column[None, :], float("-inf"))
        code = self._pick(logits0, 0, noise[:, 0], self.blocked0)
        self.seen.scatter_(1, code[:, None], True)
        self.codes[:, 0] = code
        # depth decoder: position 0 = backbone state, 1 = codebook-0 embedding (a 2-position prefill)
        row_code = code[self.row_stream].clamp(max=self.vocab - 1)
        x = lm.depth_prefill_inputs(self.hidden, row_code)
        x = self._depth(x, 0, 2, self.depth_prefill_mask)
        for p in range(1, self.codebooks):
            logits = lm.depth_logits(x[:, -1], p)
            code = self._pick(self._combine(logits), p, noise[:, p, : self.vocab], self.blocked_depth)
            self.codes[:, p] = code
            if p + 1 < self.codebooks:
                # codebook p's code sits at depth position p + 1 (embedding offset p * vocab)
                embed = lm.depth_decoder.code_embedding(code[self.row_stream], p)[:, None]
                x = self._depth(embed, p + 1, 1, None)
        self.frame.add_(1)
        self.readout[:, : self.codebooks] = self.codes
        self.readout[:, READOUT_EOS] = (self.codes[:, 0] == self.lm.config.end_of_speech_id).long()
        self.readout[:, READOUT_NONFINITE] = self.nonfinite.long()

    def _depth(self, inputs: torch.Tensor, start: int, n: int, mask: torch.Tensor | None) -> torch.Tensor:
        """Depth positions start..start+n-1 (Python constants); returns the final-normed hidden [R, n, H]."""
        dm = self.lm.depth_decoder.model
        x = linear(inputs.to(self.dtype), dm.inputs_embeds_projector.weight)
        cos, sin = self.depth_cos[:, :, start:start + n], self.depth_sin[:, :, start:start + n]
        cache = self.depth_cache
        for i, layer in enumerate(self.depth_layers):
            x = layer.forward(x, cos, sin, lambda k, v, i=i: cache.write(i, start, k, v),
                              lambda i=i: cache.view(i, start + n), mask)
        return rms_norm(x, dm.norm.weight, dm.norm.eps)

    @torch.no_grad()
    def backbone_step(self, bucket: int) -> None:
        """Feed the sampled frame to the backbone; attend over the first `bucket` cache slots."""
        lm, cache = self.lm, self.cache
        codes = self.codes[self.row_stream].clamp(max=self.vocab - 1)
        x = lm.embed_frames(codes)[:, None].to(self.dtype)  # [R, 1, H]
        cache.mark_written()
        mask = torch.where(cache.step_mask(bucket), 0.0, torch.finfo(torch.float32).min)
        cos, sin = lm.backbone_model.rotary(cache.rope_pos[:, None], cache.key.dtype)
        cos, sin = cos[:, None], sin[:, None]
        for i, layer in enumerate(self.backbone_layers):
            x = layer.forward(x, cos, sin, lambda k, v, i=i: cache.write_step(i, k, v),
                              lambda i=i: cache.view(i, bucket), mask)
        norm = lm.backbone_model.norm
        last = rms_norm(x[:, -1], norm.weight, norm.eps)
        self.hidden.copy_(last)
        self.logits.copy_(lm.backbone_logits(last))
        cache.advance()


def _kv_dtype(lm) -> torch.dtype:
    """Keys/values come out of the k/v projections in the residual stream's dtype."""
    return lm.embed_audio_tokens.weight.dtype


