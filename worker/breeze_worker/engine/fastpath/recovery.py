"""Recovering a frame whose values went non-finite: the stream's rows recomputed at a safe precision.

A batched step flags a stream whose logits (codebook 0's or any depth position's) held NaN or infinity. Under
`fp16-mixed` that is an FP16 overflow the start-up probe did not see (a prompt unlike its own, a massive
activation). Recomputing in the same precision would overflow again, and a retry with the same seed would too,
so the stream's frame is recomputed at a safe precision and generation continues from the same sampling state:

- the safe precision is the model's own modules (the eager reference, engine/eager.py) with every half-precision
  linear layer computing in FP32 from its FP16 weights (`precision.widened`): the same weights, no value rounded
  to FP16, so nothing overflows; under `fp32` it is the FP32 reference itself;
- the frame is the same frame: the backbone step that produced its codebook-0 logits (or the prompt's prefill,
  for frame 0) is recomputed for the stream's rows and rewrites their cache slots, then codebook 0 and the 15
  depth codebooks are sampled with the same counter-based noise (seed, frame, codebook: engine/sampling.py),
  the same settings and the repetition history of the frames already emitted; so the seed's output is what
  the safe precision produces from the state the served precision built;
- generation continues: the backbone step the batched step had queued for this stream (fed with codes that were
  never emitted) is recomputed with the recovered frame, leaving the next frame's logits; the stream's depth
  cache rows are zeroed (a masked NaN is still NaN when added to a mask);
- only the stream's own rows and slot are read or written, outside the step's CUDA graphs (the device runs the
  recomputation after the step's queued work, on the same stream), so the other streams of the step are
  untouched.

`widened` also records each half-precision layer's largest value: the first one beyond FP16's range names
where the served precision overflowed (logged once per request, reported in the job's stats). If the safe
recomputation is not finite either, `RecoveryFailed` says so and the request ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from breeze_worker.engine.eager import combine_rows, depth_frame
from breeze_worker.engine.precision import widened
from breeze_worker.engine.sampling import RowSampling, apply_repetition_penalty, sample_rows
from breeze_worker.model.lm.layers import additive_mask

SAFE_PRECISION = "FP32 from the served weights (every half-precision layer widened)"


class RecoveryFailed(Exception):
    """The safe recomputation of a frame was not finite either (`layer`: where values left FP16's range)."""

    def __init__(self, message: str, layer: str | None):
        super().__init__(message)
        self.layer = layer


@dataclass
class RowPrompt:
    """A row's own prompt (no padding) as rows of its join's prompt table, and where its prefill put it: cache
    slots end_slot - L .. end_slot - 1 (kept as indices, so a join copies nothing for it)."""

    table: torch.Tensor  # [N, hidden] (engine/prompt.py GatheredPrompt.table)
    index: Sequence[int]  # the row's table rows, in prompt order
    end_slot: int

    def embeds(self) -> torch.Tensor:
        return self.table.index_select(0, torch.as_tensor(self.index, dtype=torch.int64, device=self.table.device))


@dataclass
class StreamHistory:
    """What recovering one of a stream's frames needs beyond the step's own buffers, kept by the stepper."""

    seen: set[int] = field(default_factory=set)  # codebook-0 codes of the frames emitted so far
    previous: torch.Tensor | None = None  # the last emitted frame, int64 [16] on the host
    prompts: dict[int, RowPrompt] = field(default_factory=dict)  # per row, until the first frame is out

    def emitted(self, codes: torch.Tensor, code0: int) -> None:
        self.seen.add(code0)
        self.previous = codes
        self.prompts.clear()


@dataclass
class Recovered:
    frame: torch.Tensor | None  # int64 [16] on the host; None: the recomputed frame is end of speech
    layer: str | None  # the first half-precision layer whose values left FP16's range, if any


class _RowCache:
    """The KV-cache protocol (model/lm/layers.py) over ONE row of the static backbone cache: the call's keys
    and values are written at `slots` (in the cache's dtype, as the fast path stores them) and every valid
    slot up to the last of them is returned, read back from the cache, in the queries' dtype."""

    def __init__(self, key: torch.Tensor, value: torch.Tensor, row: int, slots: torch.Tensor, read: torch.Tensor):
        self.key, self.value, self.row, self.slots, self.read = key, value, row, slots, read

    def update(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k_row, v_row = self.key[layer, self.row], self.value[layer, self.row]  # [kv, L, D]
        k_row[:, self.slots] = key[0].to(k_row.dtype)
        v_row[:, self.slots] = value[0].to(v_row.dtype)
        return k_row[:, self.read][None].to(key.dtype), v_row[:, self.read][None].to(value.dtype)


def _backbone_row(step, row: int, embeds: torch.Tensor, slots: list[int], positions: list[int]) -> torch.Tensor:
    """The backbone over `embeds` [T, hidden] of one row, written at cache `slots` (marked valid) with RoPE
    `positions`, attending over the row's valid slots up to each position's own: the last position's normed
    state [hidden]."""
    lm, cache, device = step.lm, step.cache, step.device
    slot_index = torch.tensor(slots, dtype=torch.int64, device=device)
    cache.valid[row, slot_index] = True
    read = torch.nonzero(cache.valid[row, : slots[-1] + 1]).flatten()
    allowed = read[None, :] <= slot_index[:, None]  # [T, K]: causal over cache slots
    x = embeds.to(step.dtype)[None]
    mask = additive_mask(allowed[None, None], x.dtype)
    pos = torch.tensor([positions], dtype=torch.int64, device=device)
    return lm.backbone(x, pos, mask, _RowCache(cache.key, cache.value, row, slot_index, read))[0, -1]


def _rope_position(step, row: int, slot: int) -> int:
    """RoPE position of a row's cache slot: the valid slots before it (left padding has none)."""
    return int(step.cache.valid[row, :slot].sum())


def _recompute_logits(step, rows: list[int], frame: int, history: StreamHistory, logits_slots: dict[int, int]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's normed backbone state [R, hidden] and codebook-0 logits [R, V + 1] for `frame`: its prefill
    (frame 0) or the backbone step at its `logits_slots` slot fed with the previous frame."""
    lm = step.lm
    states = []
    for row in rows:
        if frame == 0:
            prompt = history.prompts[row]
            embeds = prompt.embeds()
            length = embeds.shape[0]
            states.append(_backbone_row(step, row, embeds, list(range(prompt.end_slot - length, prompt.end_slot)),
                                        list(range(length))))
        else:
            assert history.previous is not None  # frame >= 1: a frame was emitted before
            embed = lm.embed_frames(history.previous.to(step.device)[None])
            slot = logits_slots[row]
            states.append(_backbone_row(step, row, embed, [slot], [_rope_position(step, row, slot)]))
    hidden = torch.stack(states)
    return hidden, lm.backbone_logits(hidden)


def recover_frame(step, *, slot: int, rows: list[int], frame: int, history: StreamHistory,
                  logits_slots: dict[int, int], next_slots: dict[int, int] | None) -> Recovered:
    """Recompute frame `frame` of the stream in step slot `slot` with model rows `rows` ([cond], [cond,
    uncond], or with two guidance scales [instruction, clone, plain]) at the safe precision (module
    docstring). Per row, `logits_slots`: the cache slot of the backbone step that produced the frame's
    codebook-0 logits (unused for frame 0); `next_slots`: where the stream's next backbone step writes (its
    recomputed continuation), None when the stream ends with this frame. Writes the rows' cache slots, hidden
    state and pending logits and the slot's repetition history; raises `RecoveryFailed`."""
    lm, device = step.lm, step.device
    cfg_scale, ref_scale = float(step.cfg_scale[slot]), float(step.ref_scale[slot])
    sampling = RowSampling(temperature=step.sampling.temperature[slot:slot + 1],
                           top_k=step.sampling.top_k[slot:slot + 1], top_p=step.sampling.top_p[slot:slot + 1],
                           repetition_penalty=step.sampling.repetition_penalty[slot:slot + 1],
                           seed=step.sampling.seed[slot:slot + 1])
    counter = torch.tensor([frame], dtype=torch.int64, device=device)
    with torch.no_grad(), widened(lm) as record:
        hidden, logits = _recompute_logits(step, rows, frame, history, logits_slots)
        finite = torch.isfinite(logits).all()
        seen = torch.zeros(1, step.vocab + 1, dtype=torch.bool, device=device)
        if history.seen:
            seen[0, torch.tensor(sorted(history.seen), device=device)] = True
        scores = apply_repetition_penalty(combine_rows(logits, cfg_scale, ref_scale), seen,
                                          sampling.repetition_penalty)
        if bool(step.eos_masked[slot]):  # the bench's "never", as the step's frame start applies it
            scores = scores.masked_fill(step.eos_column[None, :], -1e30)
        code0 = sample_rows(scores, sampling, counter, 0, step.blocked0)
        codes = None
        if int(code0) != lm.config.end_of_speech_id:
            codes, depth_finite = depth_frame(lm, hidden, code0, sampling, counter, step.blocked_depth, cfg_scale,
                                               ref_scale)
            finite = finite & depth_finite
        if not bool(finite):
            raise RecoveryFailed(f"frame {frame} was not finite at the safe precision either", record.first_overflow())
        if codes is not None:
            seen[0, code0] = True
            step.seen[slot] = seen[0]
            if next_slots is not None and not _continue(step, rows, codes, next_slots):
                raise RecoveryFailed(f"the backbone step after frame {frame} was not finite at the safe precision",
                                     record.first_overflow())
        step.scrub(rows, backbone=False)  # the depth rows may hold what the overflowing pass wrote
    return Recovered(frame=None if codes is None else codes.cpu(), layer=record.first_overflow())


def _continue(step, rows: list[int], codes: torch.Tensor, next_slots: dict[int, int]) -> bool:
    """The stream's next backbone step, fed with the recovered frame: each row's cache slot in `next_slots`,
    its hidden state and the next frame's pending logits. False when those logits are not finite."""
    lm = step.lm
    embed = lm.embed_frames(codes[None])
    for row in rows:
        slot = next_slots[row]
        state = _backbone_row(step, row, embed, [slot], [_rope_position(step, row, slot)])
        logits = lm.backbone_logits(state[None])
        if not bool(torch.isfinite(logits).all()):
            return False
        step.hidden[row] = state.to(step.hidden.dtype)
        step.logits[row] = logits[0]
    return True
