"""Prompt preparation, shared by the eager reference path and the fast path.

A request's prompt is laid out once: `lay_out` tokenizes its text segments into token layouts ([positive],
[positive, negative] when CFG is on, [instruction, clone, plain] with two guidance scales; model/prompts.py)
when `resolve_request` validates it, and the `ResolvedRequest` carries them (`prompt`) to the join. There
the text segments are encoded, by the text encoder alone or batched with other joiners'
(`prompt_text_segments`), and `prepare_prompt_embeddings`
builds the backbone prefill inputs: text encodings, reference-audio frame embeddings and the end-of-audio
embedding in layout order, the rows left-padded to one length.

Joins of several requests (engine/batching.py) skip `PromptBatch`: `gather_prompts` puts every joiner's
pieces (text encodings, reference frames, the end-of-audio embedding) into one table and describes each
prompt row as indices into it, so the batched prefill's input is one gather, not a few small copies per
piece and row; the rows it gives are `prepare_prompt_embeddings`' values exactly.

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
class GatheredPrompt:
    """A request's prefill rows as indices into `table` (`gather_prompts`; shared by the requests gathered
    together): one per branch, in `lay_out`'s order (row 0 the prompt, the last the negative prompt).
    `length` is PromptBatch's: the longest row (the rows are left-padded to it, padding at positions 1, as
    `prepare_prompt_embeddings` lays them out)."""

    table: torch.Tensor  # [N, H]; its last row is zeros (padding)
    rows: list[np.ndarray]  # int64 table indices of each row's tokens, in prompt order
    length: int


@dataclass
class PromptBatch:
    """Backbone prefill inputs: one row per branch in `lay_out`'s order (row 0 the prompt, the last the
    negative prompt); left padded."""

    inputs_embeds: torch.Tensor  # [R, L, H], model dtype
    attention_mask: torch.Tensor  # bool [R, L], True on real tokens
    positions: torch.Tensor  # int64 [R, L]: 0.. over real tokens, 1 on padding (as the official code)
    lengths: tuple[int, ...]  # unpadded length per row

    @property
    def length(self) -> int:
        return int(self.inputs_embeds.shape[1])


def _source(tokenizer, template: Template, text: str, instruction: str | None,
            reference: ResolvedReference | None, uses_cfg: bool, dual: bool = False) -> tuple:
    """What a prompt's layouts are made from (the tokenizer by identity: one per loaded model)."""
    frames = 0 if reference is None else int(reference.codes.shape[0])
    transcript = None if reference is None else reference.transcript
    branches = 3 if dual else 2 if uses_cfg else 1
    return id(tokenizer), template.value, text, instruction, transcript, frames, branches


def lay_out(tokenizer, template: Template, text: str, instruction: str | None,
            reference: ResolvedReference | None, uses_cfg: bool, dual: bool = False) -> LaidOutPrompt:
    """The prompt's token layouts: [positive], [positive, negative] with CFG, or with `dual` (two guidance
    scales) the three branches [instruction, clone, plain] (model/prompts.py `dual_segments`). ValueError when
    the prompt cannot be laid out (resolve_request turns it into InvalidRequest)."""
    source = _source(tokenizer, template, text, instruction, reference, uses_cfg, dual)
    _, template_name, _, _, transcript, frames, _ = source
    args = (template_name, text, instruction, transcript, frames)
    if dual:
        branches = prompts.dual_segments(*args)
    else:
        branches = [prompts.positive_segments(*args)]
        if uses_cfg:
            negative = prompts.negative_segments(*args)
            if negative is None:
                raise ValueError(f"guidance on the {template_name} template, which has no negative prompt")
            branches.append(negative)
    return LaidOutPrompt(layouts=tuple(prompts.build_prompts(tokenizer, branches)),
                         source=source)


def prompt_layouts(model: LoadedModel, request: ResolvedRequest) -> list[prompts.PromptLayout]:
    """The token layouts of a request's branches (`lay_out`): those it carries from its resolution when they
    were made from its prompt inputs with this model's tokenizer, else laid out now."""
    source = _source(model.tokenizer, request.template, request.text, request.instruction, request.reference,
                     request.uses_cfg, request.dual_cfg)
    carried = request.prompt
    if carried is not None and carried.source == source:
        return list(carried.layouts)
    return list(lay_out(model.tokenizer, request.template, request.text, request.instruction, request.reference,
                        request.uses_cfg, request.dual_cfg).layouts)


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


@torch.no_grad()
def gather_prompts(model: LoadedModel, requests: list[ResolvedRequest],
                   encoder) -> list[GatheredPrompt | BaseException]:
    """Several requests' prompts for one prefill, sharing one table: a GatheredPrompt per request, or the
    exception that request's prompt raised. `encoder` encodes the text segments of all of them at once
    (`encode_flat`: fastpath/prompt.py TextEncoderGraphs). One request alone gets the values
    `prepare_prompt_embeddings` gives with the same encoder's encodings."""
    lm, config, device = model.lm, model.config, model.device
    out: list[GatheredPrompt | BaseException | None] = []
    layouts: dict[int, list[prompts.PromptLayout]] = {}
    segments: dict[int, list[torch.Tensor]] = {}
    for i, request in enumerate(requests):  # a failing prompt fails its request only
        try:
            layouts[i] = prompt_layouts(model, request)
            segments[i] = prompt_text_segments(model, request, layouts[i])
        except Exception as exc:  # noqa: BLE001
            out.append(exc)
            continue
        out.append(None)  # filled below
    text, starts = encoder.encode_flat([seg for segs in segments.values() for seg in segs])
    parts = [text]
    size = int(text.shape[0])
    # every reference's frames in one host array, one copy (pinned: queued behind the encoder's work, not
    # waiting for it) and one embedding call: the join's host work does not grow with its clone requests
    references: dict[int, tuple[int, int]] = {}  # request -> (first table row, frames) of its reference
    reference_codes: list[np.ndarray] = []
    for i, request in enumerate(requests):
        if i not in layouts or request.reference is None:
            continue
        codes = np.asarray(request.reference.codes)
        if codes.ndim != 2 or codes.shape[1] != config.num_codebooks or not np.issubdtype(codes.dtype, np.integer):
            out[i] = ValueError(f"reference codes of shape {codes.shape} ({codes.dtype}); expected "
                                f"[frames, {config.num_codebooks}] integers")
            continue
        references[i] = (size, int(codes.shape[0]))
        size += references[i][1]
        reference_codes.append(codes)
    if reference_codes:
        host = torch.from_numpy(np.concatenate(reference_codes).astype(np.int64, copy=False))
        if device.type == "cuda":
            host = host.pin_memory()
        parts.append(lm.embed_frames(host.to(device, non_blocking=True)))  # [sum of frames, H]
    eos_frame = torch.full((config.num_codebooks,), config.codebook_eos_token_id, dtype=torch.int64, device=device)
    parts.append(lm.embed_frames(eos_frame)[None])
    eos_row = size
    parts.append(torch.zeros_like(parts[-1]))
    table = torch.cat(parts)
    seg = 0
    for i in segments:
        own = starts[seg:seg + len(segments[i])]
        seg += len(segments[i])
        if isinstance(out[i], BaseException):
            continue
        pieces = iter(zip(own, (int(s.numel()) for s in segments[i])))
        rows = []
        for layout in layouts[i]:
            index = []
            for span in layout.spans:
                if span.kind == prompts.TEXT:
                    first, n = next(pieces)
                    index.append(np.arange(first, first + n))
                elif span.kind == prompts.AUDIO:
                    first, frames = references[i]  # audio spans are laid out for the request's reference only
                    index.append(np.arange(first, first + frames))
                else:
                    index.append(np.array([eos_row]))
            rows.append(np.concatenate(index).astype(np.int64))
        out[i] = GatheredPrompt(table, rows, max(len(r) for r in rows))
    filled = [p for p in out if p is not None]
    assert len(filled) == len(requests)  # every request got its prompt or its error
    return filled
