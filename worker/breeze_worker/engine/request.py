"""Request semantics: validation, defaults, template choice and the frame limit (`resolve_request`).

Inputs are honoured exactly and never normalized (no trimming, no silent clamping): anything that cannot
be served as given is an `InvalidRequest` whose message says what to change.

- Template: reference -> clone, reference + instruction -> direction, instruction -> instruction (voice
  design), otherwise plain.
- cfg_scale: unset means 1.0 for plain / clone and the checkpoint default for instruction / direction (the
  official default is 1.0 too: guidance is opt-in). A value other than 1 on a template without a negative
  prompt is an error, never a silent change; non-finite, <= 0 or above 100 is an error.
- Voice direction's two guidance scales (cfg_scale_reference, cfg_scale_instruction): both or neither, on
  the direction template only (reference + transcript + instruction), never beside cfg_scale (two forms of
  guidance); each finite in [0, 100] (0 drops that branch's pull). With them cfg_scale is 1 and the request
  takes three branches (model/prompts.py `dual_segments`).
- Text, instruction and transcript: with a visible character (a letter, digit, punctuation mark or symbol: not
  only whitespace, zero-width or formatting characters), within the character limit, and free of control tokens
  (`prompts.control_tokens`: <bos>, <ins_bos>, [S0]..[S9], the audio markers, the tokenizer's special
  tokens), which the tokenizer would read as prompt structure rather than words.
- Sampling overrides: bounded so every value stays finite in float32 (temperature 0 or in [1e-3, 100],
  repetition penalty <= 1000, top-k < 2**31).
- request_id: at most 128 characters, none of them a control character (it only labels the request's log
  lines; the worker assigns the job id).
- Frame limit: unset means a generous multiple of the text's expected speech time (CJK characters ~4/s,
  other visible characters ~12/s, slow ends of normal speech), x3 plus 3 s, so a random-weight model or a
  runaway tail stops early; never above the model's 1500-frame cap nor the backbone sequence budget left
  after the prompt. A text whose expected speech time (x1) does not fit in that cap is an error (it would
  be cut off): split it. An explicit limit above that cap is an error.
"""

from __future__ import annotations

import math
import os
import re
import unicodedata

from breeze_worker.engine.prompt import lay_out
from breeze_worker.engine.types import (
    PcmEncoding,
    ResolvedReference,
    ResolvedRequest,
    SamplingOverrides,
    SamplingParams,
    SynthesisRequest,
    Template,
)
from breeze_worker.errors import InvalidRequest
from breeze_worker.model import prompts
from breeze_worker.model.loaded import GenerationDefaults

MAX_SEED = 2**63
MAX_FRAMES_PER_CHUNK = 50
NUM_CODEBOOKS, CODEBOOK_SIZE = 16, 2048  # the codec's frame: 16 codes in [0, 2048)
CJK_CHARS_PER_S = 4.0
OTHER_CHARS_PER_S = 12.0
LIMIT_MULTIPLE = 3.0
LIMIT_SLACK_S = 3.0
# upper bounds that keep every request value finite (and meaningful) in float32 / int32 on the device
MAX_TEMPERATURE = 100.0
MIN_TEMPERATURE = 1e-3  # a positive temperature below this overflows the scaled logits; 0 is greedy
MAX_CFG_SCALE = 100.0
MAX_REPETITION_PENALTY = 1000.0  # logits x 1000 stay far inside float32
MAX_TOP_K = 2**31 - 1
MAX_REQUEST_ID_CHARS = 128


_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002fa1f]")
_ASCII_UNCOUNTED = re.compile("[\x00-\x20\x7f]")  # ASCII's whitespace and control characters
# Unicode's control characters (category Cc: U+0000-001F and U+007F-009F); in a text, all but tab, line feed
# and carriage return
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROL_IN_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def expected_speech_seconds(text: str) -> float:
    """A rough reading time: CJK characters (kana, hangul included) at ~4/s, other letters, digits and
    punctuation at ~12/s; whitespace and control characters count for nothing. (Counted with regular
    expressions where the text allows: it runs for every request on the event loop.)"""
    cjk = len(_CJK.findall(text))
    rest = _CJK.sub("", text) if cjk else text
    if rest.isascii():
        other = len(rest) - len(_ASCII_UNCOUNTED.findall(rest))
    else:
        other = sum(1 for ch in rest if not ch.isspace() and unicodedata.category(ch)[0] != "C")
    return cjk / CJK_CHARS_PER_S + other / OTHER_CHARS_PER_S


def default_frame_limit(text: str, frame_rate: float) -> int:
    return _frame_limit(expected_speech_seconds(text), frame_rate)


def _frame_limit(speech_s: float, frame_rate: float) -> int:
    return math.ceil((LIMIT_MULTIPLE * speech_s + LIMIT_SLACK_S) * frame_rate)


def _has_visible(value: str) -> bool:
    """Whether `value` holds a letter, digit, punctuation mark or symbol (Unicode categories L, N, P, S): not
    only whitespace, zero-width and formatting characters (Cf, such as U+200B) or combining marks."""
    if value.isascii():
        return any("!" <= ch <= "~" for ch in value)
    return any(unicodedata.category(ch)[0] in "LNPS" for ch in value)


def _check_text(name: str, value: str, max_chars: int, tokenizer=None) -> None:
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string")
    if not value.strip():
        raise InvalidRequest(f"{name} is empty or only whitespace: give the words to speak" if name == "text"
                             else f"{name} is empty or only whitespace: give one or leave it unset")
    if len(value) > max_chars:
        raise InvalidRequest(f"{name} has {len(value)} characters, more than the limit of {max_chars}: "
                             "shorten it or split it into several requests")
    control = _CONTROL_IN_TEXT.search(value)
    if control is not None:
        raise InvalidRequest(f"{name} contains the control character U+{ord(control.group()):04X} at position "
                             f"{control.start()}: remove it (only tab, line feed and carriage return are allowed)")
    if not _has_visible(value):  # after the length check: it looks at every character
        raise InvalidRequest(f"{name} has no visible character (only spaces, zero-width or other formatting "
                             "characters, or combining marks with nothing to mark): give the words to speak")
    markers = prompts.reserved_markers_in(value, tokenizer)
    if markers:
        raise InvalidRequest(f"{name} contains the reserved marker(s) {', '.join(markers)}, which the tokenizer "
                             "reads as control tokens of the prompt, not as words: remove them")


def check_request_id(request_id: str | None) -> None:
    """A request id labels log lines: bounded and free of control characters (cheap; checked first)."""
    if request_id is None:
        return
    if not isinstance(request_id, str):
        raise InvalidRequest("request_id must be a string")
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidRequest(f"request_id has {len(request_id):,} characters, more than the limit of "
                             f"{MAX_REQUEST_ID_CHARS}: use a shorter id (a UUID has 36)")
    control = _CONTROL.search(request_id)
    if control is not None:
        raise InvalidRequest(f"request_id contains the control character U+{ord(control.group()):04X} at "
                             f"position {control.start()}: use printable characters only")


def _finite(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a finite number, not {value!r}")
    return float(value)


def _resolve_sampling(overrides: SamplingOverrides, defaults: GenerationDefaults) -> SamplingParams:
    o = overrides or SamplingOverrides()
    temperature = defaults.temperature if o.temperature is None else _finite(o.temperature, "temperature")
    if not 0 <= temperature <= MAX_TEMPERATURE:
        raise InvalidRequest(f"temperature must be in [0, {MAX_TEMPERATURE:g}] (0 means greedy), not {temperature}")
    if 0 < temperature < MIN_TEMPERATURE:
        raise InvalidRequest(f"temperature {temperature} is too small to sample with (the scaled scores overflow): "
                             f"use 0 for greedy decoding or at least {MIN_TEMPERATURE:g}")
    top_k = defaults.top_k if o.top_k is None else o.top_k
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= MAX_TOP_K:
        raise InvalidRequest(f"top_k must be an integer in [0, 2**31 - 1] (0 disables it; any value above the "
                             f"2051 code classes keeps them all), not {top_k!r}")
    top_p = defaults.top_p if o.top_p is None else _finite(o.top_p, "top_p")
    if not 0 < top_p <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1] (1 disables it), not {top_p}")
    penalty = (defaults.repetition_penalty if o.repetition_penalty is None
               else _finite(o.repetition_penalty, "repetition_penalty"))
    if not 0 < penalty <= MAX_REPETITION_PENALTY:
        raise InvalidRequest(f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}] (1 disables it), "
                             f"not {penalty}")
    return SamplingParams(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
                          repetition_penalty=float(penalty))


def _resolve_cfg(req: SynthesisRequest, template: Template, defaults: GenerationDefaults) -> float:
    guided = prompts.has_negative_branch(template.value)
    if req.cfg_scale is None:
        return float(getattr(defaults, "cfg_scale", 1.0)) if guided else 1.0
    scale = _finite(req.cfg_scale, "cfg_scale")
    if not 0 < scale <= MAX_CFG_SCALE:
        raise InvalidRequest(f"cfg_scale must be in (0, {MAX_CFG_SCALE:g}] (1 means no guidance), not {scale}")
    if scale != 1.0 and not guided:
        raise InvalidRequest(
            f"cfg_scale {scale} needs a negative prompt, and the {template.value} template has none (guidance "
            "contrasts the prompt with its instruction-free version): set cfg_scale to 1 or leave it unset, or "
            "add an instruction to use the instruction / direction template")
    return scale


def _resolve_dual_cfg(req: SynthesisRequest, template: Template) -> tuple[float, float] | None:
    """Voice direction's (reference, instruction) guidance scales, or None when the request has neither."""
    ref, ins = req.cfg_scale_reference, req.cfg_scale_instruction
    if ref is None and ins is None:
        return None
    if ref is None or ins is None:
        given, missing = (("cfg_scale_reference", "cfg_scale_instruction") if ins is None
                          else ("cfg_scale_instruction", "cfg_scale_reference"))
        raise InvalidRequest(f"{given} was set without {missing}: voice direction's two guidance scales go "
                             "together, set both or neither")
    if req.cfg_scale is not None:
        raise InvalidRequest("cfg_scale was set beside cfg_scale_reference and cfg_scale_instruction: they are two "
                             "forms of guidance, set cfg_scale alone or the two scales without it")
    if template is not Template.DIRECTION:
        lacks = {Template.PLAIN: "reference audio with its transcript and an instruction",
                 Template.INSTRUCTION: "reference audio with its transcript",
                 Template.CLONE: "an instruction"}[template]
        raise InvalidRequest(f"cfg_scale_reference and cfg_scale_instruction guide the direction template "
                             f"(reference audio, its transcript and an instruction); this request is "
                             f"{template.value}: add {lacks}, or drop the two scales")
    scales = []
    for name, value in (("cfg_scale_reference", ref), ("cfg_scale_instruction", ins)):
        scale = _finite(value, name)
        if not 0 <= scale <= MAX_CFG_SCALE:
            raise InvalidRequest(f"{name} must be in [0, {MAX_CFG_SCALE:g}] (0 drops that branch's pull), "
                                 f"not {scale}")
        scales.append(scale)
    return scales[0], scales[1]


def _resolve_seed(seed) -> int:
    if seed is None:
        return int.from_bytes(os.urandom(8), "little") % MAX_SEED
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_SEED:
        raise InvalidRequest(f"seed must be an integer in [0, 2**63), not {seed!r}; leave it unset for a random one")
    return seed


def _check_reference(req: SynthesisRequest, reference: ResolvedReference | None, max_chars: int,
                     tokenizer=None) -> None:
    ref = req.reference
    if ref is None:
        if reference is not None:
            raise ValueError("a resolved reference was passed for a request without one")
        return
    has_audio = bool(ref.audio) or bool(ref.reference_id)
    has_transcript = ref.transcript is not None and ref.transcript != ""
    if ref.audio and ref.reference_id:
        raise InvalidRequest("send either reference audio or a reference id, not both")
    if has_audio and not has_transcript and not ref.reference_id:
        raise InvalidRequest("reference audio needs its exact transcript: add the words spoken in the reference "
                             "audio, or drop the reference")
    if has_transcript and not has_audio:
        raise InvalidRequest("a reference transcript was given without reference audio: add the audio (or a "
                             "reference id), or drop the transcript")
    if not has_audio:
        raise InvalidRequest("the reference is empty: give reference audio with its transcript, or drop it")
    if reference is None:
        raise ValueError("the request has a reference but none was resolved: run reference intake first")
    _check_text("reference transcript", reference.transcript, max_chars, tokenizer)
    codes = reference.codes
    if getattr(codes, "ndim", 0) != 2 or codes.shape[0] < 1 or codes.shape[1] != NUM_CODEBOOKS:
        raise InvalidRequest("the reference audio gave no frames: send a longer reference clip")
    if codes.min() < 0 or codes.max() >= CODEBOOK_SIZE:
        raise InvalidRequest(f"the reference codes are out of the codec's range [0, {CODEBOOK_SIZE}): "
                             "re-send the audio")


def _check_fits(expected_s: float, cap: int, defaults: GenerationDefaults) -> None:
    """A text whose expected speech (x1, `expected_speech_seconds`) is longer than the frames this request may
    have would be cut off."""
    allowed_s = cap / defaults.frame_rate
    if expected_s > allowed_s:
        raise InvalidRequest(f"the text is about {expected_s:.0f} s of speech; this request allows at most "
                             f"{allowed_s:.1f} s ({cap} frames: the model's {defaults.max_frames}-frame cap and "
                             "its sequence budget with the prompt): split the text into shorter requests")


def resolve_request(req: SynthesisRequest, defaults: GenerationDefaults, reference: ResolvedReference | None, *,
                    max_text_chars: int = 2000, tokenizer=None) -> ResolvedRequest:
    check_request_id(req.request_id)
    _check_text("text", req.text, max_text_chars, tokenizer)
    if req.instruction is not None:
        _check_text("instruction", req.instruction, max_text_chars, tokenizer)
    _check_reference(req, reference, max_text_chars, tokenizer)
    template = Template(prompts.template_for(req.reference is not None, req.instruction is not None))
    dual = _resolve_dual_cfg(req, template)
    cfg_scale = 1.0 if dual is not None else _resolve_cfg(req, template, defaults)
    sampling = _resolve_sampling(req.sampling, defaults)
    seed = _resolve_seed(req.seed)
    fpc = req.frames_per_chunk
    if isinstance(fpc, bool) or not isinstance(fpc, int) or not 1 <= fpc <= MAX_FRAMES_PER_CHUNK:
        raise InvalidRequest(f"frames_per_chunk must be an integer from 1 to {MAX_FRAMES_PER_CHUNK}, not {fpc!r}")
    if not isinstance(req.encoding, PcmEncoding):
        raise InvalidRequest(f"encoding must be one of {[e.value for e in PcmEncoding]}, not {req.encoding!r}")

    cap = int(defaults.max_frames)
    laid_out = None
    if tokenizer is not None:  # laid out once here; the join encodes these layouts (engine/prompt.py)
        try:
            laid_out = lay_out(tokenizer, template, req.text, req.instruction, reference, cfg_scale != 1.0,
                               dual=dual is not None)
        except ValueError as exc:
            raise InvalidRequest(f"the prompt cannot be laid out: {exc}") from exc
        length = max(len(layout) for layout in laid_out.layouts)  # the longest branch (guidance adds rows)
        room = int(defaults.max_sequence) - 1 - length  # the official loop stops at prompt + frames = max - 1
        if room < 1:
            raise InvalidRequest(f"the prompt takes {length} of the model's {defaults.max_sequence} positions, "
                                 "leaving no room for audio: shorten the text, instruction or reference")
        cap = min(cap, room)
    if req.max_frames is None:
        expected_s = expected_speech_seconds(req.text)
        _check_fits(expected_s, cap, defaults)
        max_frames = min(cap, _frame_limit(expected_s, defaults.frame_rate))
    else:
        max_frames = req.max_frames
        if isinstance(max_frames, bool) or not isinstance(max_frames, int) or max_frames < 1:
            raise InvalidRequest(f"max_frames must be a positive integer, not {max_frames!r}")
        if max_frames > cap:
            raise InvalidRequest(f"max_frames {max_frames} is above this request's cap of {cap} frames "
                                 f"({cap / defaults.frame_rate:.1f} s; the model allows {defaults.max_frames} frames "
                                 f"and {defaults.max_sequence} positions with the prompt): lower it or leave it unset")
    return ResolvedRequest(
        text=req.text, instruction=req.instruction, cfg_scale=cfg_scale, seed=seed, template=template,
        sampling=sampling, max_frames=max_frames, encoding=req.encoding, frames_per_chunk=fpc, reference=reference,
        prompt=laid_out, cfg_scale_reference=None if dual is None else dual[0],
        cfg_scale_instruction=None if dual is None else dual[1],
    )
