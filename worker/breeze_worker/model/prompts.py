"""The four prompt templates, their negative (CFG) prompts, and the token layout of a prompt.

| template    | positive prompt                                              | negative prompt |
|-------------|--------------------------------------------------------------|-----------------|
| plain       | [S0]{text}                                                   | none            |
| instruction | [S0]<ins_bos>{instruction}<ins_eos>{text}                    | [S0]{text}      |
| clone       | [S0]{transcript}, <|AUDIO|> x T, <|audio_eos|>, [S0]{text}   | none            |
| direction   | [S0]{transcript}, <|AUDIO|> x T, <|audio_eos|>,              | the clone prompt|
|             | [S0]<ins_bos>{instruction}<ins_eos>{text}                    |                 |

Voice direction also has a guidance with two scales (`dual_segments`): three branches, the instruction
prompt (the instruction template's, no reference), the clone prompt and the plain prompt, whose logits
combine u + s_ref * (clone - u) + s_ins * (instruction - u) with u the plain prompt's; the direction
prompt itself is not one of them.

Tokenization follows the official recipe: each text segment is tokenized *with* special tokens (so it
gains a leading <bos>) and decoded back to a string; an audio segment renders as T `<|AUDIO|>` markers and
one `<|audio_eos|>`; the strings are concatenated and the whole is tokenized once without special tokens.
A clone / direction prompt therefore carries a second `<bos>` in the middle, at the start of the text
segment after the reference audio. Each rendered piece's share of the prompt is the run of tokens that start in
it (the whole prompt's character offsets; `build_prompts`), which is what tokenizing the piece alone gives;
each text segment (its <bos> included) is encoded by the text encoder on its own.

User strings (text, instruction, transcript) must not contain a control token: the tokenizer would read
it as that token, not as text (a fake `<ins_bos>` section, a second speaker, a `<bos>`, the eoi embedding).
`control_tokens_in` finds them: our prompt markers (the speaker tokens [S0]..[S9] included: we never
produce [S1]..[S9], so they are rejected too), every added token the tokenizer flags special, and every
added token that looks like a marker (`<...>` or `[...]` without whitespace, e.g. Gemma's `<unused0>`,
`<start_of_turn>`, `<table>`). Added tokens that are plain text (runs of spaces, tabs, newlines) stay allowed.
"""

from __future__ import annotations

import bisect
import re
import weakref
from dataclasses import dataclass

from breeze_worker.model.tokenizer import AUDIO_EOS_TOKEN, AUDIO_TOKEN, BOS, EOS, PAD, BreezeTokenizer

PLAIN, INSTRUCTION, CLONE, DIRECTION = "plain", "instruction", "clone", "direction"
TEMPLATES = (PLAIN, INSTRUCTION, CLONE, DIRECTION)
SPEAKER = "[S0]"
INS_BOS, INS_EOS = "<ins_bos>", "<ins_eos>"
# markers whose presence in user text would break the prompt layout
RESERVED_MARKERS = (AUDIO_TOKEN, AUDIO_EOS_TOKEN)
# control tokens of the Breeze / Gemma-3 vocabulary, rejected in user text even without a tokenizer at hand
CONTROL_TOKENS = (*RESERVED_MARKERS, BOS, EOS, PAD, "<unk>", INS_BOS, INS_EOS, *(f"[S{i}]" for i in range(10)),
                  "<end_of_image>", "<start_of_image>")
_MARKER_LIKE = re.compile(r"<[^<>\s]+>|\[[^\[\]\s]+\]")

TEXT, AUDIO, AUDIO_EOS = "text", "audio", "audio_eos"


@dataclass(frozen=True)
class Segment:
    """A text piece (`text`) or the reference audio (`frames` codes, rendered with its end marker)."""

    kind: str  # TEXT or AUDIO
    text: str = ""
    frames: int = 0


@dataclass(frozen=True)
class Span:
    """A run of prompt positions: a text segment (encoded on its own), audio frames or the audio end."""

    kind: str  # TEXT, AUDIO or AUDIO_EOS
    start: int
    length: int


@dataclass(frozen=True)
class PromptLayout:
    input_ids: tuple[int, ...]
    spans: tuple[Span, ...]

    def __len__(self) -> int:
        return len(self.input_ids)

    def text_segments(self) -> list[tuple[int, ...]]:
        return [self.input_ids[s.start : s.start + s.length] for s in self.spans if s.kind == TEXT]


def template_for(has_reference: bool, has_instruction: bool) -> str:
    if has_reference:
        return DIRECTION if has_instruction else CLONE
    return INSTRUCTION if has_instruction else PLAIN


def has_negative_branch(template: str) -> bool:
    return str(template) in (INSTRUCTION, DIRECTION)


def _plain_text(text: str) -> Segment:
    return Segment(TEXT, f"{SPEAKER}{text}")


def _instruction_text(text: str, instruction: str) -> Segment:
    return Segment(TEXT, f"{SPEAKER}{INS_BOS}{instruction}{INS_EOS}{text}")


def _reference_prefix(transcript: str, frames: int) -> list[Segment]:
    return [Segment(TEXT, f"{SPEAKER}{transcript}"), Segment(AUDIO, frames=frames)]


def positive_segments(template: str, text: str, instruction: str | None = None, transcript: str | None = None,
                      reference_frames: int = 0) -> list[Segment]:
    template = str(getattr(template, "value", template))
    if template == PLAIN:
        return [_plain_text(text)]
    if template == INSTRUCTION:
        return [_instruction_text(text, _required(instruction, "instruction"))]
    prefix = _reference_prefix(_required(transcript, "transcript"), _frames(reference_frames))
    if template == CLONE:
        return prefix + [_plain_text(text)]
    if template == DIRECTION:
        return prefix + [_instruction_text(text, _required(instruction, "instruction"))]
    raise ValueError(f"unknown template {template!r}; expected one of {TEMPLATES}")


def negative_segments(template: str, text: str, instruction: str | None = None, transcript: str | None = None,
                      reference_frames: int = 0) -> list[Segment] | None:
    """The CFG negative prompt, or None where the template has none (plain, clone)."""
    template = str(getattr(template, "value", template))
    if template == INSTRUCTION:
        return positive_segments(PLAIN, text)
    if template == DIRECTION:
        return positive_segments(CLONE, text, transcript=transcript, reference_frames=reference_frames)
    if template in (PLAIN, CLONE):
        return None
    raise ValueError(f"unknown template {template!r}; expected one of {TEMPLATES}")


def dual_segments(template: str, text: str, instruction: str | None = None, transcript: str | None = None,
                  reference_frames: int = 0) -> list[list[Segment]]:
    """The three branches of the two-scale guidance, in row order: [instruction, clone, plain] prompts.
    Only the direction template has them (it is the one with both a reference and an instruction)."""
    template = str(getattr(template, "value", template))
    if template != DIRECTION:
        raise ValueError(f"two guidance scales need the {DIRECTION} template (reference and instruction), "
                         f"not {template!r}")
    return [positive_segments(INSTRUCTION, text, instruction),
            positive_segments(CLONE, text, transcript=transcript, reference_frames=reference_frames),
            positive_segments(PLAIN, text)]


def _required(value: str | None, name: str) -> str:
    if value is None:
        raise ValueError(f"this template needs a {name}")
    return value


def _frames(frames: int) -> int:
    if frames < 1:
        raise ValueError("a reference prompt needs at least one audio frame")
    return frames


def render(tokenizer: BreezeTokenizer, segment: Segment) -> str:
    if segment.kind == TEXT:
        return tokenizer.decode(tokenizer.encode(segment.text, add_special_tokens=True), skip_special_tokens=False)
    return AUDIO_TOKEN * segment.frames + AUDIO_EOS_TOKEN


def build_prompt(tokenizer: BreezeTokenizer, segments: list[Segment]) -> PromptLayout:
    """Token ids of a prompt and which positions are text segments, audio frames and the audio end."""
    return build_prompts(tokenizer, [segments])[0]


def build_prompts(tokenizer: BreezeTokenizer, branches: list[list[Segment]]) -> list[PromptLayout]:
    """`build_prompt` of each branch (a request's prompt and its negative prompt), rendering a text segment
    the branches share once.

    The segment boundaries come from the whole prompt's own tokenization: a token belongs to the rendered
    piece its characters start in. A token whose characters run into the next piece means the boundary
    merged with its neighbour, and the prompt is refused, as it is when the pieces' tokens do not cover the
    prompt. Where no token crosses a boundary, each piece's run of tokens is what tokenizing the piece alone
    gives (the tokenizer splits at the added markers before anything else; tests/model check it against
    transformers' tokenizer). Why not tokenize each piece again: a clone prompt's audio piece is one marker
    per reference frame, and tokenizing it twice per branch was about half of a guided clone's layout time
    with a 12 s reference."""
    rendered: dict[str, str] = {}
    layouts = []
    for segments in branches:
        pieces = []
        for seg in segments:
            if seg.kind == TEXT:
                if seg.text not in rendered:
                    rendered[seg.text] = render(tokenizer, seg)
                pieces.append(rendered[seg.text])
            else:
                pieces.append(render(tokenizer, seg))
        layouts.append(_lay_out_pieces(tokenizer, segments, pieces))
    return layouts


def _lay_out_pieces(tokenizer: BreezeTokenizer, segments: list[Segment], pieces: list[str]) -> PromptLayout:
    ids_list, offsets = tokenizer.encode_with_offsets("".join(pieces))
    ids = tuple(ids_list)
    spans: list[Span] = []
    start = 0  # the piece's first token
    end_char = 0
    for seg, piece in zip(segments, pieces):
        end_char += len(piece)
        # the tokens come in text order and do not overlap: the piece's last token is the one that could cross
        stop = bisect.bisect_left(offsets, (end_char,), lo=start)
        if stop > start and offsets[stop - 1][1] > end_char:
            raise ValueError("a token of the prompt spans two of its segments; a segment boundary merged "
                             "with its neighbour")
        length = stop - start
        if seg.kind == TEXT:
            spans.append(Span(TEXT, start, length))
        else:
            spans.append(Span(AUDIO, start, seg.frames))
            spans.append(Span(AUDIO_EOS, start + seg.frames, 1))
            if length != seg.frames + 1:
                raise ValueError("the audio markers did not tokenize one token per frame")
        start = stop
    if start != len(ids):
        raise ValueError(f"prompt segments cover {start} tokens but the prompt has {len(ids)}; "
                         "a segment boundary merged with its neighbour")
    markers = {tokenizer.audio_token_id, tokenizer.audio_eos_token_id}
    for span in spans:
        want = {AUDIO: tokenizer.audio_token_id, AUDIO_EOS: tokenizer.audio_eos_token_id}.get(span.kind)
        got = ids[span.start : span.start + span.length]
        if want is not None and got.count(want) != len(got):
            raise ValueError("reference audio markers are not where the layout puts them")
        if want is None and not markers.isdisjoint(got):
            raise ValueError(f"text contains an audio marker ({AUDIO_TOKEN} or {AUDIO_EOS_TOKEN})")
    return PromptLayout(ids, tuple(spans))


def reserved_markers_in(text: str, tokenizer: BreezeTokenizer | None = None) -> list[str]:
    """The control tokens present in a user string (each once, in order of appearance); see
    `control_tokens`. Without a tokenizer only the fixed `CONTROL_TOKENS` are looked for."""
    found = dict.fromkeys(_control_pattern(tokenizer).findall(text))
    return list(found)


def control_tokens(tokenizer: BreezeTokenizer | None = None) -> tuple[str, ...]:
    """Strings the tokenizer reads as control tokens, never as text: `CONTROL_TOKENS`, the tokenizer's own
    bos / eos / pad / audio markers, its added tokens flagged special, and its marker-like added tokens."""
    tokens = set(CONTROL_TOKENS)
    if tokenizer is not None:
        for token_id in (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id, tokenizer.audio_token_id,
                         tokenizer.audio_eos_token_id):
            token = tokenizer.tokenizer.id_to_token(token_id)
            if token:
                tokens.add(token)
        for added in tokenizer.tokenizer.get_added_tokens_decoder().values():
            content = added.content
            if content and (added.special or _MARKER_LIKE.fullmatch(content)):
                tokens.add(content)
    return tuple(sorted(tokens))


_PATTERNS: weakref.WeakKeyDictionary[BreezeTokenizer, re.Pattern] = weakref.WeakKeyDictionary()


def _build_pattern(tokens: tuple[str, ...]) -> re.Pattern:
    """One alternation over `tokens`, longest first (so a token never hides a longer one it starts)."""
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=lambda t: (-len(t), t))))


_DEFAULT_PATTERN = _build_pattern(CONTROL_TOKENS)


def _control_pattern(tokenizer: BreezeTokenizer | None) -> re.Pattern:
    """The pattern of `control_tokens(tokenizer)`, built once per tokenizer."""
    if tokenizer is None:
        return _DEFAULT_PATTERN
    pattern = _PATTERNS.get(tokenizer)
    if pattern is None:
        pattern = _PATTERNS[tokenizer] = _build_pattern(control_tokens(tokenizer))
    return pattern
