"""Request semantics: templates, CFG rules, sampling overrides, seeds, frame limits, and every invalid input."""

from __future__ import annotations

import math

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


@pytest.mark.parametrize("text, match", [("", "empty"), ("   \n", "empty"), ("x" * 2001, "2001 characters"),
                                         ("a <|AUDIO|> b", "reserved marker")])
def test_bad_text(text, match):
    with pytest.raises(InvalidRequest, match=match):
        resolve(text=text)


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
    assert resolve(text="x" * 2000).max_frames == 1500  # capped by the model


def test_explicit_frame_limit_is_checked_against_the_cap(tiny):
    assert resolve(max_frames=1500).max_frames == 1500
    for bad in (0, -1, 1501):
        with pytest.raises(InvalidRequest, match="max_frames"):
            resolve(max_frames=bad)
    # with a tokenizer the cap also keeps prompt + frames inside the 2048-position budget
    long_text = "x" * 1500
    r = resolve(tiny, text=long_text)
    prompt = len(tiny.tokenizer.encode("[S0]" + long_text, True))
    assert r.max_frames == 2048 - 1 - prompt
    with pytest.raises(InvalidRequest, match="cap of"):
        resolve(tiny, text=long_text, max_frames=2048 - prompt)


def test_prompt_longer_than_the_sequence_budget_is_rejected(tiny):
    with pytest.raises(InvalidRequest, match="leaving no room"):
        resolve(tiny, text="x" * 1990, instruction="y" * 100)
