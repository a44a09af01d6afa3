"""Prompt layouts against the official recipe run by transformers' tokenizer.

The recipe (model/prompt_templates.py): each text segment tokenized with special tokens and decoded back, the audio
rendered as markers, the whole string tokenized once; each piece's share of the prompt is what tokenizing the
piece alone gives. `build_prompts` finds the pieces' shares from the whole prompt's character offsets instead;
here AutoTokenizer, loading the same tokenizer files, runs the recipe as written, and every layout must have
its ids and its span lengths, or be refused where the recipe's pieces do not add up to the prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from breeze_worker.model import prompt_templates as templates
from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.synthetic import WORDS, config_for
from breeze_worker.model.tokenizer import BreezeTokenizer

TEXTS = ["Hello there.", "the quick brown fox jumps over the lazy dog", "  leading and trailing spaces  ",
         "中文語音合成，測試。", "emoji 🙂 é ß and tabs\tand\nnewlines", "a", "word word word", "end with space "]
INSTRUCTIONS = ["calm and slow", " whisper ", "用溫柔的聲音"]
TRANSCRIPTS = ["the reference words", "參考音檔的逐字稿", "ends with a space ", " starts with one"]


def _save(tokenizer: BreezeTokenizer, directory: Path, marker_flags: dict | None = None) -> Path:
    """The tokenizer's files as a checkpoint ships them; `marker_flags` changes the audio markers' matching."""
    directory.mkdir(parents=True)
    spec = json.loads(tokenizer.to_str())
    for token in spec["added_tokens"]:
        if marker_flags and token["content"] in (templates.AUDIO_TOKEN, templates.AUDIO_EOS_TOKEN):
            token.update(marker_flags)
    (directory / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>"}), encoding="utf-8")
    return directory


def _recipe(theirs, segments: list[templates.Segment]) -> tuple[list[int], list[int]] | None:
    """(ids, each piece's token count) by the recipe as written, or None where the pieces do not add up."""
    pieces = []
    for seg in segments:
        if seg.kind == templates.TEXT:
            pieces.append(theirs.decode(theirs.encode(seg.text, add_special_tokens=True),
                                        skip_special_tokens=False))
        else:
            pieces.append(templates.AUDIO_TOKEN * seg.frames + templates.AUDIO_EOS_TOKEN)
    ids = theirs.encode("".join(pieces), add_special_tokens=False)
    lengths = [len(theirs.encode(piece, add_special_tokens=False)) for piece in pieces]
    return (ids, lengths) if sum(lengths) == len(ids) else None


def _lengths(layout: templates.PromptLayout) -> list[int]:
    """Each piece's token count: a text span, or an audio span with its end marker."""
    out = []
    for span in layout.spans:
        if span.kind == templates.AUDIO_EOS:
            out[-1] += span.length
        else:
            out.append(span.length)
    return out


def _branches() -> list[list[list[templates.Segment]]]:
    """Every template's [positive] or [positive, negative] segments over the samples."""
    cases = []
    for text in TEXTS:
        for instruction in INSTRUCTIONS:
            for transcript in TRANSCRIPTS:
                for template in templates.TEMPLATES:
                    args = (template, text, instruction, transcript, 3)
                    negative = templates.negative_segments(*args)
                    cases.append([templates.positive_segments(*args)] + ([negative] if negative else []))
    return cases


@pytest.fixture(scope="module", params=["tiny", "full"])
def sized(request) -> tuple[BreezeConfig, BreezeTokenizer]:
    """The tiny default's letter-by-letter tokenizer, and the full-size one with whole-word tokens (whose
    pieces can merge across a boundary), each with its model config."""
    config = config_for(request.param)
    return config, BreezeTokenizer.tiny(config, WORDS if request.param == "full" else ())


def test_layouts_have_the_recipes_ids_and_spans(sized, tmp_path):
    _, tokenizer = sized
    theirs = AutoTokenizer.from_pretrained(str(_save(tokenizer, tmp_path / "tok")))
    checked = 0
    for branches in _branches():
        ours = templates.build_prompts(tokenizer, branches)
        for segments, layout in zip(branches, ours):
            expected = _recipe(theirs, segments)
            assert expected is not None, segments  # these tokenizers split every sample cleanly
            ids, lengths = expected
            assert list(layout.input_ids) == ids, segments
            assert _lengths(layout) == lengths, segments
            # each text span is the segment's own tokenization with special tokens: what the encoder reads
            texts = [s.text for s in segments if s.kind == templates.TEXT]
            assert [list(t) for t in layout.text_segments()] == [
                theirs.encode(t, add_special_tokens=True) for t in texts], segments
            checked += 1
    assert checked == len(TEXTS) * len(INSTRUCTIONS) * len(TRANSCRIPTS) * 6  # 4 positive + 2 negative prompts


def test_a_marker_that_takes_in_its_neighbours_space_is_refused_as_the_recipe_refuses_it(sized, tmp_path):
    """Audio markers that strip the whitespace before them (lstrip): a transcript ending in a space then loses
    that space into the marker, the recipe's pieces no longer add up, and the layout is refused, not shifted."""
    config, tokenizer = sized
    directory = _save(tokenizer, tmp_path / "tok", {"lstrip": True})
    ours = BreezeTokenizer.from_checkpoint(directory, config)
    theirs = AutoTokenizer.from_pretrained(str(directory))
    spaced = templates.positive_segments(templates.CLONE, "Hello there.", transcript="ends with a space ",
                                       reference_frames=3)
    assert _recipe(theirs, spaced) is None
    with pytest.raises(ValueError, match="segment"):
        templates.build_prompt(ours, spaced)
    clean = templates.positive_segments(templates.CLONE, "Hello there.", transcript="no space", reference_frames=3)
    expected = _recipe(theirs, clean)
    assert expected is not None
    layout = templates.build_prompt(ours, clean)
    assert (list(layout.input_ids), _lengths(layout)) == expected

