"""The eager frame generator: one request, plain PyTorch, a growing KV cache. The numerical reference for
the fast path, which must reproduce these frames exactly; both take their prefill inputs from
engine/prompt.py (`prepare_prompt_embeddings`).

Per frame (the official decoding loop):
1. backbone logits of the last position (FP32); with CFG the two rows (cond, uncond) are combined
   `u + s*(c - u)`, with two guidance scales the three rows (instruction, clone, plain prompts)
   `u + s_ref*(r - u) + s_ins*(i - u)` (the reference implementation's order of terms); the repetition
   penalty divides / multiplies logits of codebook-0 codes this request has already produced; reserved ids
   (codebook_size .. vocab-1) are masked; `sample_rows` draws codebook 0 with the request's counter-based
   noise (frame index, codebook 0). The end-of-speech class ends the request.
2. depth decoder: 2-position prefill (backbone hidden, codebook 0), then one position per codebook; each
   head's logits are CFG-combined the same way, reserved ids masked, and sampled as codebook 1..15 (no
   repetition penalty). The sampled code is written to every row of the request.
3. the frame is yielded, then fed back to the backbone as its summed embedding (every row).
The frame limit is the request's `max_frames`, further capped so prompt + frames stays below the model's
sequence budget (the official loop stops at max_sequence - 1).
When a tracer is active (engine/tracing.py) the loop records spans: text_encode, prefill, and per frame
backbone_step, sampling, depth_steps > depth_step; off, each costs one global read.
"""

from __future__ import annotations

import time

import torch

from breeze_worker.engine import tracing
from breeze_worker.engine.prompt import prepare_prompt_embeddings
from breeze_worker.engine.sampling import RowSampling, apply_repetition_penalty, sample_rows
from breeze_worker.engine.types import EndReason, ResolvedRequest
from breeze_worker.model.lm.layers import additive_mask
from breeze_worker.model.loaded import LoadedModel


class EagerFrameGenerator:
    """Iterate to get int64 [16] CPU frames; `.end_reason` is set once the iterator is exhausted."""

    def __init__(self, model: LoadedModel, request: ResolvedRequest, device: torch.device | str | None = None):
        self.model, self.request = model, request
        self.device = torch.device(device) if device is not None else model.device
        self.end_reason: EndReason | None = None
        self.frames_emitted = 0
        self.timings = {"text_encode_s": 0.0, "prefill_s": 0.0, "generate_s": 0.0}
        self._frames = self._run()

    def __iter__(self) -> EagerFrameGenerator:
        return self

    def __next__(self) -> torch.Tensor:
        return next(self._frames)

    def close(self) -> None:
        self._frames.close()

    # ---- the loop ----
    def _combine(self, logits: torch.Tensor) -> torch.Tensor:
        return combine_rows(logits, *self._scales)

    @property
    def _scales(self) -> tuple[float, float]:
        """(the cond or instruction row's scale, the clone row's scale: 0 without two guidance scales)."""
        request = self.request
        if request.dual_cfg:
            assert request.cfg_scale_instruction is not None and request.cfg_scale_reference is not None
            return float(request.cfg_scale_instruction), float(request.cfg_scale_reference)
        return float(request.cfg_scale), 0.0

    @torch.no_grad()
    def _run(self):
        model, request = self.model, self.request
        lm, config = model.lm, model.config
        t0 = time.perf_counter()
        with tracing.span("text_encode"):
            prompt = prepare_prompt_embeddings(model, request)
        t1 = time.perf_counter()
        self.timings["text_encode_s"] = t1 - t0
        with tracing.span("prefill"):  # the backbone prefill and the sampling state
            dtype, device = prompt.inputs_embeds.dtype, prompt.inputs_embeds.device
            n_rows, length = prompt.inputs_embeds.shape[:2]
            cache = lm.new_backbone_cache()
            causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
            allowed = causal[None, None] & prompt.attention_mask[:, None, None, :]
            hidden = lm.backbone(prompt.inputs_embeds, prompt.positions, additive_mask(allowed, dtype), cache)[:, -1]
            logits = lm.backbone_logits(hidden)
            self.timings["prefill_s"] = time.perf_counter() - t1

            limit = min(request.max_frames, model.generation_defaults.max_sequence - 1 - length)
            rows = RowSampling.from_params([request.sampling], [request.seed], device)
            vocab = config.vocab_size
            blocked = torch.zeros(vocab + 1, dtype=torch.bool, device=device)
            blocked[list(config.reserved_code_ids)] = True
            seen = torch.zeros(1, vocab + 1, dtype=torch.bool, device=device)
            key_valid = prompt.attention_mask
            next_position = prompt.positions[:, -1:] + 1

        frame_index = 0
        # trace: frame i spans its backbone step (i >= 1), sampling, depth steps, and whatever the consumer
        # does with the frame before asking for the next one (codec decode, emit)
        frame_spans = tracing.span_sequence("frame")
        while True:
            started = time.perf_counter()
            if frame_index >= limit:
                frame_spans.close()
                self.end_reason = EndReason.FRAME_LIMIT
                return
            if frame_index == 0:
                frame_spans.next(index=0)
            frame = torch.tensor([frame_index], dtype=torch.int64, device=device)
            with tracing.span("sampling", codebook=0):
                scores = apply_repetition_penalty(self._combine(logits), seen, rows.repetition_penalty)
                code0 = sample_rows(scores, rows, frame, 0, blocked)  # [1]
                is_end = int(code0.item()) == config.end_of_speech_id
            if is_end:
                frame_spans.close()
                self.timings["generate_s"] += time.perf_counter() - started
                self.end_reason = EndReason.END_OF_SPEECH
                return
            with tracing.span("depth_steps"):
                codes = self._depth_frame(hidden, code0, rows, frame, blocked[:vocab])
            self.timings["generate_s"] += time.perf_counter() - started
            self.frames_emitted += 1
            try:
                yield codes.cpu()
            except GeneratorExit:
                frame_spans.close()
                raise
            started = time.perf_counter()
            frame_index += 1
            if frame_index >= limit:
                frame_spans.close()
                self.end_reason = EndReason.FRAME_LIMIT
                return
            frame_spans.next(index=frame_index)
            with tracing.span("backbone_step"):
                seen[0, code0] = True
                embeds = lm.embed_frames(codes.expand(n_rows, -1))[:, None]  # [R, 1, H]
                key_valid = torch.cat((key_valid, torch.ones(n_rows, 1, dtype=torch.bool, device=device)), dim=1)
                mask = additive_mask(key_valid[:, None, None, :], dtype)
                hidden = lm.backbone(embeds, next_position, mask, cache)[:, -1]
                next_position = next_position + 1
                logits = lm.backbone_logits(hidden)
            self.timings["generate_s"] += time.perf_counter() - started

    def _depth_frame(self, backbone_hidden: torch.Tensor, code0: torch.Tensor, rows: RowSampling,
                     frame: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
        """Codebooks 1..15 for one frame -> int64 [16] (codebook 0 first)."""
        return depth_frame(self.model.lm, backbone_hidden, code0, rows, frame, blocked, *self._scales)[0]


def combine_rows(logits: torch.Tensor, cfg_scale: float, ref_scale: float = 0.0) -> torch.Tensor:
    """[R, V] -> [1, V]: one row as it is; CFG rows (cond, uncond) combined u + s*(c - u); the three rows of two
    guidance scales (instruction, clone, plain) combined u + s_ref*(r - u) + s*(i - u), `cfg_scale` being the
    instruction's scale (the reference implementation's order of terms)."""
    if logits.shape[0] == 1:
        return logits
    if logits.shape[0] == 3:
        ins, ref, uncond = logits[:1], logits[1:2], logits[2:3]
        return uncond + ref_scale * (ref - uncond) + cfg_scale * (ins - uncond)
    cond, uncond = logits[:1], logits[1:2]
    return uncond + cfg_scale * (cond - uncond)


def depth_frame(lm, backbone_hidden: torch.Tensor, code0: torch.Tensor, rows: RowSampling, frame: torch.Tensor,
                blocked: torch.Tensor, cfg_scale: float, ref_scale: float = 0.0
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The depth decoder's codebooks 1..15 of one frame from the backbone's last state of each row [R, H] and
    codebook 0's code [1]: (codes int64 [16], codebook 0 first; a bool whether every depth logit was finite)."""
    n_rows, device = backbone_hidden.shape[0], backbone_hidden.device
    cache = lm.new_depth_cache()
    with tracing.span("depth_step", codebook=1):  # the 2-position prefill: backbone state, codebook 0
        inputs = lm.depth_prefill_inputs(backbone_hidden, code0.expand(n_rows))
        causal = additive_mask(torch.ones(2, 2, dtype=torch.bool, device=device).tril()[None, None], inputs.dtype)
        hidden = lm.depth_decoder(inputs, torch.arange(2, device=device), causal, cache)[:, -1]
    codes = [code0]
    finite = torch.ones((), dtype=torch.bool, device=device)
    num_codebooks = lm.config.num_codebooks
    for position in range(1, num_codebooks):
        with tracing.span("sampling", codebook=position):
            logits = combine_rows(lm.depth_logits(hidden, position), cfg_scale, ref_scale)
            finite = finite & torch.isfinite(logits).all()
            code = sample_rows(logits, rows, frame, position, blocked)
        codes.append(code)
        if position == num_codebooks - 1:
            break
        with tracing.span("depth_step", codebook=position + 1):
            embed = lm.depth_decoder.code_embedding(code.expand(n_rows), position)[:, None]
            hidden = lm.depth_decoder(embed, torch.tensor([position + 1], device=device), None, cache)[:, -1]
    return torch.cat(codes), finite
