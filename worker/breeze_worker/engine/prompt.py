"""Prompt preparation, shared by the eager reference path and the fast path.

A request's prompt is laid out once: `lay_out` tokenizes its text segments into token layouts ([positive],
or [positive, negative] when CFG is on; model/prompts.py) when `resolve_request` validates it, and the
`ResolvedRequest` carries them (`prompt`) to the join. There the text segments are encoded, by the text
encoder alone or batched with other joiners' (`prompt_text_segments`), and `prepare_prompt_embeddings`
builds the backbone prefill inputs: text encodings, reference-audio frame embeddings and the end-of-audio
embedding in layout order, the rows left-padded to one length.

A request resolved without a tokenizer (or changed after resolution) is laid out here instead: the layouts
are used only when they were made from the request's own prompt inputs with the model's tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from breeze_worker.engine.types import LaidOutPrompt, ResolvedReference, ResolvedRequest, Template
from breeze_worker.model import prompts
from breeze_worker.model.loaded import LoadedModel


@dataclass
class PromptBatch:
    """Backbone prefill inputs: row 0 the prompt, row 1 the negative prompt when CFG is on; left padded."""

    inputs_embeds: torch.Tensor  # [R, L, H], model dtype
    attention_mask: torch.Tensor  # bool [R, L], True on real tokens
    positions: torch.Tensor  # int64 [R, L]: 0.. over real tokens, 1 on padding (as the official code)
    lengths: tuple[int, ...]  # unpadded length per row

    @property
    def length(self) -> int:
        return int(self.inputs_embeds.shape[1])


def _source(tokenizer, template: Template, text: str, instruction: str | None,
            reference: ResolvedReference | None, uses_cfg: bool) -> tuple:
    """What a prompt's layouts are made from (the tokenizer by identity: one per loaded model)."""
    frames = 0 if reference is None else int(reference.codes.shape[0])
    transcript = None if reference is None else reference.transcript
    return id(tokenizer), template.value, text, instruction, transcript, frames, uses_cfg


def lay_out(tokenizer, template: Template, text: str, instruction: str | None,
            reference: ResolvedReference | None, uses_cfg: bool) -> LaidOutPrompt:
    """The prompt's token layouts: [positive], or [positive, negative] with CFG. ValueError when the prompt
    cannot be laid out (resolve_request turns it into InvalidRequest)."""
    source = _source(tokenizer, template, text, instruction, reference, uses_cfg)
    _, template_name, _, _, transcript, frames, _ = source
    args = (template_name, text, instruction, transcript, frames)
    branches = [prompts.positive_segments(*args)]
    if uses_cfg:
        negative = prompts.negative_segments(*args)
        if negative is None:
            raise ValueError(f"guidance on the {template_name} template, which has no negative prompt")
        branches.append(negative)
    return LaidOutPrompt(layouts=tuple(prompts.build_prompt(tokenizer, segments) for segments in branches),
                         source=source)


def prompt_layouts(model: LoadedModel, request: ResolvedRequest) -> list[prompts.PromptLayout]:
    """[positive] or [positive, negative] token layouts of a request: those it carries from its resolution when
    they were made from its prompt inputs with this model's tokenizer, else laid out now."""
    source = _source(model.tokenizer, request.template, request.text, request.instruction, request.reference,
                     request.uses_cfg)
    carried = request.prompt
    if carried is not None and carried.source == source:
        return list(carried.layouts)
    return list(lay_out(model.tokenizer, request.template, request.text, request.instruction, request.reference,
                        request.uses_cfg).layouts)


def prompt_text_segments(model: LoadedModel, request: ResolvedRequest,
                         layouts: list[prompts.PromptLayout] | None = None) -> list[torch.Tensor]:
    """The request's text segments, in the order `prepare_prompt_embeddings` consumes their encodings
    (`layouts`: `prompt_layouts(model, request)` when the caller has them)."""
    layouts = prompt_layouts(model, request) if layouts is None else layouts
    return [torch.tensor(seg, dtype=torch.int64) for layout in layouts for seg in layout.text_segments()]


@torch.no_grad()
def prepare_prompt_embeddings(model: LoadedModel, request: ResolvedRequest,
                              encoded: list[torch.Tensor] | None = None,
                              layouts: list[prompts.PromptLayout] | None = None) -> PromptBatch:
    """`encoded`: the text encoder's output for `prompt_text_segments(model, request)`, when the caller
    encoded them itself (several requests' segments in one batch, or through the fast path's text-encoder
    graphs); None encodes them here. `layouts`: `prompt_layouts(model, request)` when the caller has them."""
    lm, config = model.lm, model.config
    device = model.device
    layouts = prompt_layouts(model, request) if layouts is None else layouts
    if encoded is None:
        encoded = lm.encode_segments(prompt_text_segments(model, request, layouts))
    segments = iter(encoded)
    ref_embeds = None
    if request.reference is not None:
        # a copy: the reference's codes may be read-only
        codes = torch.tensor(np.asarray(request.reference.codes), dtype=torch.int64, device=device)
        ref_embeds = lm.embed_frames(codes)  # [T, H]
    eos_frame = torch.full((config.num_codebooks,), config.codebook_eos_token_id, dtype=torch.int64, device=device)
    eos_embed = lm.embed_frames(eos_frame)[None]  # [1, H]: the all-zero frame
    rows = []
    for layout in layouts:
        pieces = []
        for span in layout.spans:
            if span.kind == prompts.TEXT:
                pieces.append(next(segments))
            elif span.kind == prompts.AUDIO:
                assert ref_embeds is not None  # audio spans are laid out for the request's reference only
                pieces.append(ref_embeds)
            else:
                pieces.append(eos_embed)
        rows.append(torch.cat(pieces, dim=0))
    longest = max(r.shape[0] for r in rows)
    hidden = rows[0].shape[1]
    embeds = torch.zeros(len(rows), longest, hidden, dtype=rows[0].dtype, device=device)
    valid = torch.zeros(len(rows), longest, dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        embeds[i, longest - row.shape[0]:] = row
        valid[i, longest - row.shape[0]:] = True
    positions = (valid.long().cumsum(-1) - 1).masked_fill(~valid, 1)
    return PromptBatch(embeds, valid, positions, tuple(r.shape[0] for r in rows))
