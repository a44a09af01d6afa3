"""Request semantics: templates, CFG rules, sampling overrides, seeds, frame limits, and every invalid input."""

from __future__ import annotations

import math
import re
import unicodedata

import numpy as np
import pytest

from breeze_worker.engine.request import default_frame_limit, expected_speech_seconds, resolve_request
from breeze_worker.engine.types import (
    ReferenceInput,
    ResolvedReference,
    SamplingOverrides,
    SamplingParams,
    SynthesisRequest,
    Template,
)
from breeze_worker.errors import InvalidRequest
from breeze_worker.model.loaded import GenerationDefaults

DEFAULTS = GenerationDefaults()
REF = ResolvedReference("ref-1", "the words", np.zeros((5, 16), dtype=np.int64), 0.4)
WITH_AUDIO = ReferenceInput(audio=b"RIFF...", transcript="the words")


def resolve(tiny=None, resolved=None, **kwargs):
    kwargs.setdefault("text", "Hello there")
    return resolve_request(SynthesisRequest(**kwargs), DEFAULTS, resolved,
                           tokenizer=None if tiny is None else tiny.tokenizer)


@pytest.mark.parametrize("kwargs, reference, template", [
    ({}, None, Template.PLAIN),
    ({"instruction": "warm"}, None, Template.INSTRUCTION),
    ({"reference": WITH_AUDIO}, REF, Template.CLONE),
    ({"reference": WITH_AUDIO, "instruction": "warm"}, REF, Template.DIRECTION),
    ({"reference": ReferenceInput(reference_id="ref-1")}, REF, Template.CLONE),
])
def test_template_choice_and_defaults(tiny, kwargs, reference, template):
    r = resolve(tiny, reference, seed=7, **kwargs)
    assert r.template is template
    assert r.cfg_scale == 1.0 and not r.uses_cfg
    assert r.sampling == SamplingParams(0.9, 50, 1.0, 1.1)
    assert r.seed == 7 and r.reference is reference and r.text == "Hello there"


@pytest.mark.parametrize("kwargs, reference", [({"instruction": "warm"}, None),
                                               ({"instruction": "warm", "reference": WITH_AUDIO}, REF)])
def test_guidance_on_templates_with_a_negative_prompt(tiny, kwargs, reference):
    assert resolve(tiny, reference, cfg_scale=2.5, **kwargs).cfg_scale == 2.5


@pytest.mark.parametrize("kwargs, reference", [({}, None), ({"reference": WITH_AUDIO}, REF)])
def test_guidance_without_a_negative_prompt_is_an_error_not_a_silent_change(kwargs, reference):
    with pytest.raises(InvalidRequest, match="no(ne)? .*negative|has none"):
        resolve(None, reference, cfg_scale=2.0, **kwargs)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_non_positive_or_non_finite_cfg_scale(scale):
    with pytest.raises(InvalidRequest, match="cfg_scale"):
        resolve(instruction="warm", cfg_scale=scale)


def test_two_guidance_scales_on_the_direction_template_take_three_branches(tiny):
    r = resolve(tiny, REF, reference=WITH_AUDIO, instruction="warm", cfg_scale_reference=1.5,
                cfg_scale_instruction=0.0)
    assert r.template is Template.DIRECTION and r.dual_cfg and r.branches == 3 and r.uses_cfg
    assert (r.cfg_scale, r.cfg_scale_reference, r.cfg_scale_instruction) == (1.0, 1.5, 0.0)
    assert r.prompt is not None and len(r.prompt.layouts) == 3
    single = resolve(tiny, REF, reference=WITH_AUDIO, instruction="warm", cfg_scale=2.0)
    assert single.branches == 2 and not single.dual_cfg and single.cfg_scale_reference is None
    assert resolve(tiny, REF, reference=WITH_AUDIO, instruction="warm").branches == 1


DIRECTION = {"reference": WITH_AUDIO, "instruction": "warm"}


@pytest.mark.parametrize("kwargs, reference, words", [
    (dict(DIRECTION, cfg_scale_reference=1.5), REF, "cfg_scale_reference was set without cfg_scale_instruction"),
    (dict(DIRECTION, cfg_scale_instruction=1.5), REF, "cfg_scale_instruction was set without cfg_scale_reference"),
    (dict(DIRECTION, cfg_scale=2.0, cfg_scale_reference=1.5, cfg_scale_instruction=2.0), REF,
     "set cfg_scale alone or the two scales without it"),
    (dict(cfg_scale_reference=1.5, cfg_scale_instruction=2.0), None,
     "this request is plain: add reference audio with its transcript and an instruction"),
    (dict(instruction="warm", cfg_scale_reference=1.5, cfg_scale_instruction=2.0), None,
     "this request is instruction: add reference audio with its transcript"),
    (dict(reference=WITH_AUDIO, cfg_scale_reference=1.5, cfg_scale_instruction=2.0), REF,
     "this request is clone: add an instruction"),
    (dict(DIRECTION, cfg_scale_reference=-0.5, cfg_scale_instruction=2.0), REF, "cfg_scale_reference must be in"),
    (dict(DIRECTION, cfg_scale_reference=1.0, cfg_scale_instruction=101.0), REF,
     "cfg_scale_instruction must be in"),
    (dict(DIRECTION, cfg_scale_reference=math.nan, cfg_scale_instruction=2.0), REF,
     "cfg_scale_reference must be a finite number"),
    (dict(DIRECTION, cfg_scale_reference=1.0, cfg_scale_instruction=True), REF,
     "cfg_scale_instruction must be a finite number"),
])
def test_invalid_combinations_of_the_two_guidance_scales_say_which(tiny, kwargs, reference, words):
    with pytest.raises(InvalidRequest) as info:
        resolve(tiny, reference, **kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize("text, match", [("", "empty"), ("   \n", "empty"), ("x" * 2001, "2001 characters"),
                                         ("a <|AUDIO|> b", "reserved marker"),
                                         ("\x00\x00\x00", "control character U\\+0000 at position 0"),
                                         ("bell\x07", "control character U\\+0007 at position 4")])
def test_bad_text(text, match):
    with pytest.raises(InvalidRequest, match=match):
        resolve(text=text)


def test_every_control_character_but_tab_and_line_ends_is_refused_where_it_is():
    """Every code point the standard library classes as a control character (Cc), at a position in a text."""
    controls = [chr(p) for p in range(0x110000) if unicodedata.category(chr(p)) == "Cc"]
    assert len(controls) == 65
    for ch in controls:
        if ch in "\t\n\r":
            assert resolve(text=f"ab{ch}cd").text == f"ab{ch}cd"
            continue
        with pytest.raises(InvalidRequest, match=f"control character U\\+{ord(ch):04X} at position 2"):
            resolve(text=f"ab{ch}c{ch}d")
    assert resolve(text="no controls: \u200b\u00ad\ufeff\U000e0001").text  # format characters (Cf) pass
    for ch in controls:  # a request id may hold none of them, tab and line ends included
        with pytest.raises(InvalidRequest, match=f"request_id contains the control character U\\+{ord(ch):04X} "
                                                 "at position 3"):
            resolve(request_id=f"id-{ch}")


def test_text_is_kept_exactly():
    assert resolve(text="  spaced  out \n").text == "  spaced  out \n"


def test_blank_instruction_is_rejected():
    with pytest.raises(InvalidRequest, match="instruction is empty"):
        resolve(instruction=" ")


@pytest.mark.parametrize("reference_input, match", [
    (ReferenceInput(audio=b"RIFF"), "needs its exact transcript"),
    (ReferenceInput(audio=b"RIFF", transcript=""), "needs its exact transcript"),
    (ReferenceInput(transcript="words"), "without reference audio"),
    (ReferenceInput(), "empty"),
    (ReferenceInput(audio=b"RIFF", transcript="w", reference_id="x"), "either"),
])
def test_reference_audio_and_transcript_come_together(reference_input, match):
    with pytest.raises(InvalidRequest, match=match):
        resolve(reference=reference_input)


def test_reference_without_frames_is_rejected():
    empty = ResolvedReference("r", "words", np.zeros((0, 16), dtype=np.int64), 0.0)
    with pytest.raises(InvalidRequest, match="no frames"):
        resolve(None, empty, reference=WITH_AUDIO)


@pytest.mark.parametrize("overrides, match", [
    (SamplingOverrides(temperature=-0.1), "temperature"), (SamplingOverrides(temperature=math.nan), "temperature"),
    (SamplingOverrides(top_k=-1), "top_k"), (SamplingOverrides(top_k=2.5), "top_k"),
    (SamplingOverrides(top_p=0.0), "top_p"), (SamplingOverrides(top_p=1.5), "top_p"),
    (SamplingOverrides(repetition_penalty=0.0), "repetition_penalty"),
    (SamplingOverrides(repetition_penalty=-2.0), "repetition_penalty"),
])
def test_bad_sampling_overrides(overrides, match):
    with pytest.raises(InvalidRequest, match=match):
        resolve(sampling=overrides)


def test_sampling_overrides_are_used():
    r = resolve(sampling=SamplingOverrides(temperature=0.0, top_k=0, top_p=0.5, repetition_penalty=1.0))
    assert r.sampling == SamplingParams(0.0, 0, 0.5, 1.0) and r.sampling.greedy


def test_seed_is_drawn_when_unset_and_validated_when_set():
    seeds = {resolve().seed for _ in range(4)}
    assert len(seeds) == 4 and all(0 <= s < 2**63 for s in seeds)
    assert resolve(seed=0).seed == 0 and resolve(seed=2**63 - 1).seed == 2**63 - 1
    for bad in (-1, 2**63, 1.5, True):
        with pytest.raises(InvalidRequest, match="seed"):
            resolve(seed=bad)


@pytest.mark.parametrize("value", [0, 51, -3])
def test_frames_per_chunk_range(value):
    with pytest.raises(InvalidRequest, match="frames_per_chunk"):
        resolve(frames_per_chunk=value)


def test_default_frame_limit_follows_text_length_in_latin_and_cjk():
    short, long_latin = resolve(text="Hi.").max_frames, resolve(text="word " * 60).max_frames
    cjk = resolve(text="你好世界" * 10).max_frames
    assert short < long_latin <= 1500
    assert short == default_frame_limit("Hi.", 12.5) == math.ceil((3 * 3 / 12 + 3) * 12.5)
    # 40 CJK characters read at ~4/s: ~10 s, far longer than 40 Latin letters (~3.3 s)
    assert expected_speech_seconds("你好世界" * 10) == pytest.approx(10.0)
    assert cjk > resolve(text="abcd" * 10).max_frames
    assert resolve(text="x" * 1000).max_frames == 1500  # capped by the model (83 s of speech: it fits)


_CJK_RANGES = ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF),
               (0x20000, 0x2FA1F))


def _reading_seconds(ch: str) -> float:
    """The reading-time rule for one character, from the standard library's character classes."""
    if any(lo <= ord(ch) <= hi for lo, hi in _CJK_RANGES):
        return 1 / 4
    return 0.0 if ch.isspace() or unicodedata.category(ch)[0] == "C" else 1 / 12


def test_reading_time_counts_every_character_by_its_class():
    """Over every code point of the BMP and the CJK supplementary ranges, in runs of 61 (mixed classes in
    one text): each run's reading time is the sum of its characters' by the rule."""
    points = [*range(0x10000), *range(0x20000, 0x20400), *range(0x2F800, 0x2FA40)]
    for start in range(0, len(points), 61):
        run = "".join(chr(p) for p in points[start:start + 61])
        assert expected_speech_seconds(run) == pytest.approx(sum(_reading_seconds(ch) for ch in run)), hex(start)
    for point in range(128):  # ASCII-only texts, each character alone and all together
        assert expected_speech_seconds(chr(point) * 3) == pytest.approx(3 * _reading_seconds(chr(point))), point
    ascii_text = "".join(map(chr, range(128)))
    assert expected_speech_seconds(ascii_text) == pytest.approx(sum(map(_reading_seconds, ascii_text)))
    assert expected_speech_seconds("Hi, 你好 ok\t\n") == pytest.approx(5 / 12 + 2 / 4)


def test_explicit_frame_limit_is_checked_against_the_cap(tiny):
    assert resolve(max_frames=1500).max_frames == 1500
    for bad in (0, -1, 1501):
        with pytest.raises(InvalidRequest, match="max_frames"):
            resolve(max_frames=bad)
    # with a tokenizer the cap also keeps prompt + frames inside the 2048-position budget
    long_text = "x" * 900  # ~75 s of speech, fits in the ~92 s the prompt leaves
    r = resolve(tiny, text=long_text)
    prompt = len(tiny.tokenizer.encode("[S0]" + long_text, True))
    assert r.max_frames == 2048 - 1 - prompt
    with pytest.raises(InvalidRequest, match="cap of"):
        resolve(tiny, text=long_text, max_frames=2048 - prompt)


def test_prompt_longer_than_the_sequence_budget_is_rejected(tiny):
    with pytest.raises(InvalidRequest, match="leaving no room"):
        resolve(tiny, text="x" * 1990, instruction="y" * 100)


# ---- control tokens in user strings ----
INJECTED = "say <ins_bos>loud<ins_eos> [S1]<bos>x"


@pytest.mark.parametrize("with_tokenizer", [False, True])
@pytest.mark.parametrize("field", ["text", "instruction", "reference transcript"])
def test_control_tokens_in_user_strings_are_rejected_naming_token_and_field(tiny, with_tokenizer, field):
    tok = tiny if with_tokenizer else None
    if field == "text":
        call = dict(text=INJECTED)
    elif field == "instruction":
        call = dict(instruction=INJECTED)
    else:
        ref = ResolvedReference("ref-x", INJECTED, np.zeros((5, 16), dtype=np.int64), 0.4)
        call = dict(resolved=ref, reference=ReferenceInput(audio=b"RIFF", transcript=INJECTED))
    with pytest.raises(InvalidRequest) as err:
        resolve(tok, **call)
    message = str(err.value)
    assert message.startswith(f"{field} contains the reserved marker(s)")
    for token in ("<ins_bos>", "<ins_eos>", "[S1]", "<bos>"):
        assert token in message


@pytest.mark.parametrize("token", ["[S0]", "[S1]", "[S5]", "[S9]", "<eos>", "<pad>", "<unk>", "<end_of_image>",
                                   "<|audio_eos|>"])
def test_every_speaker_and_special_token_is_rejected(tiny, token):
    for tok in (None, tiny):
        with pytest.raises(InvalidRequest, match=re.escape(token)):
            resolve(tok, text=f"before {token} after")


@pytest.mark.parametrize("text", ["a < b > c", "[S10 is not a token", "S1] and <bos", "5 > 3 < 4 [x y]",
                                  "emoji <3 and [laughs]"])
def test_look_alikes_that_are_not_control_tokens_are_accepted_unchanged(tiny, text):
    assert resolve(tiny, text=text).text == text


# ---- long texts ----
def test_text_longer_than_the_frame_cap_is_rejected_not_cut_off():
    with pytest.raises(InvalidRequest) as err:
        resolve(text="x" * 2000)
    assert "about 167 s of speech" in str(err.value) and "at most 120.0 s" in str(err.value)
    assert "split the text" in str(err.value)


def test_text_longer_than_the_room_the_prompt_leaves_is_rejected(tiny):
    text = "x" * 1200  # ~100 s: inside the 120 s cap, but the prompt leaves only ~845 frames (67.6 s)
    assert resolve(text=text).max_frames == 1500
    with pytest.raises(InvalidRequest, match="about 100 s of speech; this request allows at most 67.6 s"):
        resolve(tiny, text=text)


def test_bench_texts_are_accepted_with_the_tiny_tokenizer(tiny):
    from breeze_client.bench import LABELS

    for label in LABELS.values():
        assert resolve(tiny, text=label.text).max_frames >= label.frame_limit, label.name
        assert resolve(tiny, text=label.text, max_frames=label.frame_limit).max_frames == label.frame_limit
    assert LABELS["long"].words >= 115


# ---- values that would overflow on the device ----
@pytest.mark.parametrize("overrides, match", [
    (SamplingOverrides(temperature=1e39), "temperature must be in \\[0, 100\\]"),
    (SamplingOverrides(temperature=100.5), "temperature"),
    (SamplingOverrides(temperature=1e-39), "too small"),
    (SamplingOverrides(top_k=2**63), "top_k must be an integer in \\[0, 2\\*\\*31 - 1\\]"),
    (SamplingOverrides(top_k=2**31), "top_k"),
    (SamplingOverrides(repetition_penalty=1000.5), "repetition_penalty"),
    (SamplingOverrides(repetition_penalty=1e300), "repetition_penalty must be in \\(0, 1000\\]"),
])
def test_sampling_values_that_overflow_float32_are_rejected(overrides, match):
    with pytest.raises(InvalidRequest, match=match):
        resolve(sampling=overrides)


def test_sampling_bounds_are_inclusive():
    r = resolve(sampling=SamplingOverrides(temperature=100.0, top_k=2**31 - 1, repetition_penalty=1000.0))
    assert r.sampling == SamplingParams(100.0, 2**31 - 1, 1.0, 1000.0)
    assert resolve(sampling=SamplingOverrides(temperature=1e-3)).sampling.temperature == 1e-3


@pytest.mark.parametrize("scale", [1e300, 1e39, 100.01])
def test_cfg_scale_that_overflows_is_rejected(scale):
    with pytest.raises(InvalidRequest, match="cfg_scale must be in \\(0, 100\\]"):
        resolve(instruction="warm", cfg_scale=scale)
    assert resolve(instruction="warm", cfg_scale=100.0).cfg_scale == 100.0


# ---- the reference transcript is used exactly as sent ----
def test_reference_transcript_is_kept_exactly_and_blank_is_rejected(tiny):
    from engine_helpers import tone_wav

    from breeze_worker.engine.reference import ReferenceStore, reference_id
    from breeze_worker.model.codec import tiny_codec
    from breeze_worker.model.prompts import build_prompt, positive_segments

    audio = tone_wav(1.0)
    store = ReferenceStore(tiny_codec(seed=0), max_entries=4)
    sent = "  the words \n"
    ref = store.intake(audio, sent)
    assert ref.transcript == sent and ref.reference_id == reference_id(audio, sent)
    assert store.intake(audio, "the words").reference_id != ref.reference_id  # a different transcript
    for blank in ("", "   ", " \n\t"):
        with pytest.raises(InvalidRequest, match="transcript is empty"):
            store.intake(audio, blank)
    # reusing the id with the same untrimmed transcript matches what the store holds (engine/service.py)
    assert store.get(ref.reference_id).transcript == sent
    r = resolve(tiny, ref, reference=ReferenceInput(reference_id=ref.reference_id))
    assert r.reference.transcript == sent
    layout = build_prompt(tiny.tokenizer, positive_segments("clone", r.text, transcript=sent,
                                                            reference_frames=int(ref.codes.shape[0])))
    assert tiny.tokenizer.decode(list(layout.text_segments()[0])) == "<bos>[S0]" + sent


@pytest.mark.parametrize("invisible", [
    "\u200b", "\u200b\u200c\u200d\u2060\ufeff" * 20, "\u00a0\u3000\u200b", "\u0301\u0308", "\u2028\u200e"])
@pytest.mark.parametrize("field", ["text", "instruction"])
def test_a_text_without_a_visible_character_is_refused(invisible, field):
    with pytest.raises(InvalidRequest, match=f"{field} has no visible character"):
        resolve(**{field: invisible})


@pytest.mark.parametrize("visible", ["\u200bhi\u200b", "\u4f60\u597d", "?", "\u2764", "e\u0301", "\u0661"])
def test_a_text_with_a_visible_character_is_kept_as_it_is(visible):
    assert resolve(text=visible).text == visible
