"""Tokenizer special ids, the four templates, their negative prompts and the mid-prompt <bos> rule."""

from __future__ import annotations

import dataclasses

import pytest

from breeze_worker.errors import CheckpointError
from breeze_worker.model import prompts
from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.tokenizer import BreezeTokenizer, build_tiny_tokenizer


def test_tiny_tokenizer_takes_its_special_ids_from_the_config(tiny):
    tok, cfg = tiny.tokenizer, tiny.config
    assert tok.token_to_id("<|AUDIO|>") == cfg.audio_token_id
    assert tok.token_to_id("<|audio_eos|>") == cfg.audio_eos_token_id
    assert tok.token_to_id("<bos>") == cfg.bos_token_id == 2
    assert tok.token_to_id("<eos>") == 1 and tok.token_to_id("<pad>") == 0
    assert [tok.token_to_id(f"[S{i}]") for i in range(10)] == [cfg.speaker_token_ids[f"[S{i}]"] for i in range(10)]
    assert tok.token_to_id("<ins_bos>") == cfg.ins_bos_token_id and tok.token_to_id("<ins_eos>") == cfg.ins_eos_token_id
    # moved ids follow the config
    moved = dataclasses.replace(cfg, audio_token_id=cfg.audio_token_id + 1, audio_eos_token_id=cfg.audio_token_id)
    assert BreezeTokenizer(build_tiny_tokenizer(moved), moved).token_to_id("<|AUDIO|>") == cfg.audio_token_id + 1


def test_tokenizer_that_disagrees_with_the_config_is_rejected(tiny):
    other = dataclasses.replace(tiny.config, audio_token_id=tiny.config.audio_token_id + 3)
    with pytest.raises(CheckpointError, match="<\\|AUDIO\\|>"):
        BreezeTokenizer(tiny.tokenizer.tokenizer, other)


def test_any_text_round_trips(tiny):
    text = "Hello, 世界! naïve café 123"
    ids = tiny.tokenizer.encode(text, add_special_tokens=True)
    assert ids[0] == tiny.config.bos_token_id
    assert tiny.tokenizer.decode(ids) == "<bos>" + text


@pytest.mark.parametrize("template", prompts.TEMPLATES)
def test_template_choice(template):
    has_ref = template in (prompts.CLONE, prompts.DIRECTION)
    has_ins = template in (prompts.INSTRUCTION, prompts.DIRECTION)
    assert prompts.template_for(has_ref, has_ins) == template
    assert prompts.has_negative_branch(template) == has_ins


def _decode_spans(tok, layout):
    return [(s.kind, tok.decode(list(layout.input_ids[s.start : s.start + s.length]))) for s in layout.spans]


def test_plain_and_instruction_prompts(tiny):
    tok = tiny.tokenizer
    plain = prompts.build_prompt(tok, prompts.positive_segments("plain", "Hi there"))
    assert _decode_spans(tok, plain) == [("text", "<bos>[S0]Hi there")]
    assert prompts.negative_segments("plain", "Hi there") is None

    ins = prompts.build_prompt(tok, prompts.positive_segments("instruction", "Hi", "calm voice"))
    assert _decode_spans(tok, ins) == [("text", "<bos>[S0]<ins_bos>calm voice<ins_eos>Hi")]
    neg = prompts.build_prompt(tok, prompts.negative_segments("instruction", "Hi", "calm voice"))
    assert neg.input_ids == prompts.build_prompt(tok, prompts.positive_segments("plain", "Hi")).input_ids


def test_clone_prompt_has_a_mid_prompt_bos_and_audio_positions(tiny):
    tok, cfg = tiny.tokenizer, tiny.config
    layout = prompts.build_prompt(tok, prompts.positive_segments("clone", "Say this", transcript="ref words",
                                                                 reference_frames=4))
    assert [s.kind for s in layout.spans] == ["text", "audio", "audio_eos", "text"]
    ids = list(layout.input_ids)
    assert ids.count(cfg.bos_token_id) == 2  # one per text segment: the second sits mid-prompt
    second = layout.spans[3]
    assert ids[second.start] == cfg.bos_token_id
    assert ids[layout.spans[1].start : layout.spans[1].start + 4] == [cfg.audio_token_id] * 4
    assert ids[layout.spans[2].start] == cfg.audio_eos_token_id
    assert _decode_spans(tok, layout)[0] == ("text", "<bos>[S0]ref words")
    assert _decode_spans(tok, layout)[3] == ("text", "<bos>[S0]Say this")
    assert prompts.negative_segments("clone", "Say this", transcript="ref words", reference_frames=4) is None
    # the text segments the encoder sees are exactly the per-segment tokenizations
    assert layout.text_segments() == [tuple(tok.encode("[S0]ref words", True)), tuple(tok.encode("[S0]Say this", True))]


def test_direction_prompt_and_its_negative_is_the_clone_prompt(tiny):
    tok = tiny.tokenizer
    args = dict(text="Say this", instruction="whisper", transcript="ref words", reference_frames=3)
    pos = prompts.build_prompt(tok, prompts.positive_segments("direction", **args))
    assert _decode_spans(tok, pos)[3] == ("text", "<bos>[S0]<ins_bos>whisper<ins_eos>Say this")
    neg = prompts.build_prompt(tok, prompts.negative_segments("direction", **args))
    clone = prompts.build_prompt(tok, prompts.positive_segments("clone", "Say this", transcript="ref words",
                                                                reference_frames=3))
    assert neg == clone
    assert len(pos) > len(neg)


def test_two_scale_guidance_branches_are_the_instruction_clone_and_plain_prompts():
    args = ("hello", "calm", "ref words", 4)
    ins, ref, uncond = prompts.dual_segments(prompts.DIRECTION, *args)
    assert ins == prompts.positive_segments(prompts.INSTRUCTION, "hello", "calm")
    assert ref == prompts.negative_segments(prompts.DIRECTION, *args)  # the clone prompt
    assert uncond == prompts.positive_segments(prompts.PLAIN, "hello")
    for template in (prompts.PLAIN, prompts.INSTRUCTION, prompts.CLONE):
        with pytest.raises(ValueError, match="direction template"):
            prompts.dual_segments(template, *args)


def test_audio_markers_in_text_are_caught(tiny):
    assert prompts.reserved_markers_in("a <|AUDIO|> b") == ["<|AUDIO|>"]
    with pytest.raises(ValueError, match="audio marker"):
        prompts.build_prompt(tiny.tokenizer, prompts.positive_segments("plain", "x<|audio_eos|>"))


def test_full_size_special_ids_match_the_release():
    cfg = BreezeConfig.full_size()
    assert (cfg.audio_token_id, cfg.audio_eos_token_id) == (262144, 262145)
    assert cfg.speaker_token_ids["[S0]"] == 262146 and cfg.speaker_token_ids["[S9]"] == 262155
    assert (cfg.ins_bos_token_id, cfg.ins_eos_token_id) == (262156, 262157)


def test_control_tokens_come_from_the_config_and_the_tokenizers_added_tokens(tiny):
    """A Gemma-like tokenizer: special added tokens and marker-like ones are control tokens; added tokens that
    are plain text (a newline run) are not."""
    from tokenizers import AddedToken

    cfg = dataclasses.replace(tiny.config, text_encoder=dataclasses.replace(tiny.config.text_encoder, vocab_size=400))
    raw = build_tiny_tokenizer(cfg)
    raw.add_tokens([AddedToken("<start_of_turn>", special=False, normalized=False),
                    AddedToken("\n\n", special=False, normalized=False)])
    raw.add_special_tokens([AddedToken("@@ctl@@", special=True, normalized=False)])
    tok = BreezeTokenizer(raw, cfg)
    found = prompts.control_tokens(tok)
    for token in ("<start_of_turn>", "@@ctl@@", "<bos>", "<ins_bos>", "<end_of_image>", "[S0]", "[S9]",
                  "<|AUDIO|>"):
        assert token in found, token
    assert "\n\n" not in found
    text = "one\n\ntwo <start_of_turn> three @@ctl@@ <bos> [S3]"
    assert prompts.reserved_markers_in(text, tok) == ["<start_of_turn>", "@@ctl@@", "<bos>", "[S3]"]
    assert prompts.reserved_markers_in(text) == ["<bos>", "[S3]"]  # without a tokenizer: the fixed set only
    assert prompts.reserved_markers_in("one\n\ntwo [S1 <bos", tok) == []
    # the injection the check prevents: these strings tokenize as single control ids
    ids = tiny.tokenizer.encode("<ins_bos>[S1]<bos>")
    assert ids == [cfg.ins_bos_token_id, cfg.speaker_token_ids["[S1]"], cfg.bos_token_id]
    assert prompts.reserved_markers_in("<ins_bos>[S1]<bos>", tiny.tokenizer) == ["<ins_bos>", "[S1]", "<bos>"]
