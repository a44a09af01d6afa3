"""The tokenizer reads a checkpoint's tokenizer files the way transformers' AutoTokenizer does, in both
layouts a checkpoint can ship: special markers declared in tokenizer.json's `added_tokens`, or only in
tokenizer_config.json's `added_tokens_decoder` (and its named special tokens). Checked against
AutoTokenizer itself on the same directory, and a checkpoint whose markers would be split is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from breeze_worker.errors import CheckpointError
from breeze_worker.model import prompts
from breeze_worker.model.tokenizer import BreezeTokenizer

SAMPLES = ["Hello world.", "  two  spaces, tabs\tand\nnewlines ", "中文語音合成，測試。", "emoji 🙂 é ß",
           "[S0]<ins_bos>calm and slow<ins_eos>Hello<bos>there<|AUDIO|><|AUDIO|><|audio_eos|>[S0]more",
           "<bos><eos><pad>[S9]", "<bos", "ins_bos>", ""]


def _write(directory: Path, tiny, *, move_to_config: bool, settings: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    spec = json.loads(tiny.tokenizer.to_str())
    config = {"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>",
              "pad_token": "<pad>", "unk_token": "<unk>", **(settings or {})}
    if move_to_config:
        added, spec["added_tokens"] = spec["added_tokens"], []
        config["added_tokens_decoder"] = {
            str(t["id"]): {k: t[k] for k in ("content", "lstrip", "rstrip", "normalized", "single_word", "special")}
            for t in added}
    (directory / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    if move_to_config or settings:
        (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


@pytest.mark.parametrize("layout", ["tokenizer.json", "tokenizer_config.json"])
@pytest.mark.parametrize("settings", [None, {"add_bos_token": True, "add_eos_token": False}],
                         ids=["as-shipped", "flags-as-released"])  # other flags: test_tokenizer_flags.py
def test_the_same_ids_as_autotokenizer(tiny, tmp_path, layout, settings):
    directory = _write(tmp_path / "tok", tiny, move_to_config=layout == "tokenizer_config.json", settings=settings)
    ours = BreezeTokenizer.from_checkpoint(directory, tiny.config)
    theirs = AutoTokenizer.from_pretrained(str(directory))
    for text in SAMPLES:
        for special in (False, True):
            assert ours.encode(text, special) == theirs.encode(text, add_special_tokens=special), (text, special)
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs.encode(text, add_special_tokens=False))
    # the prompt recipe's leading <bos> per segment (a Gemma class adds it unless add_bos_token says otherwise)
    assert ours.encode("hi", True)[0] == tiny.config.bos_token_id


def test_prompts_are_identical_in_both_layouts(tiny, tmp_path):
    """Every template's prompt ids, the mid-prompt <bos> included, match the tokenizer.json layout's."""
    a = BreezeTokenizer.from_checkpoint(_write(tmp_path / "a", tiny, move_to_config=False), tiny.config)
    b = BreezeTokenizer.from_checkpoint(_write(tmp_path / "b", tiny, move_to_config=True), tiny.config)
    for template in prompts.TEMPLATES:
        segments = prompts.positive_segments(template, "Hello there.", instruction="warm", transcript="a reference",
                                             reference_frames=3)
        layout_a, layout_b = prompts.build_prompt(a, segments), prompts.build_prompt(b, segments)
        assert layout_a == layout_b, template
        assert layout_a.input_ids.count(tiny.config.bos_token_id) == (2 if template in ("clone", "direction") else 1)


def test_markers_that_would_be_split_are_refused(tiny, tmp_path):
    """The markers only in the config's added_tokens_decoder, but the config missing: <bos> would become its
    bytes. The checkpoint is refused, naming the marker, instead of every prompt silently differing."""
    directory = _write(tmp_path / "tok", tiny, move_to_config=True)
    (directory / "tokenizer_config.json").unlink()
    with pytest.raises(CheckpointError, match=r"reads the prompt marker '<[a-z]+>' as \d+ tokens"):
        BreezeTokenizer.from_checkpoint(directory, tiny.config)


def test_a_declared_id_the_tokenizer_does_not_give_is_refused(tiny, tmp_path):
    directory = _write(tmp_path / "tok", tiny, move_to_config=True)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    entry = config["added_tokens_decoder"].pop(str(tiny.config.audio_token_id))
    config["added_tokens_decoder"]["9999"] = entry  # <|AUDIO|> declared at an id tokenizer.json does not give it
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"declares '<\|AUDIO\|>' as id 9999"):
        BreezeTokenizer.from_checkpoint(directory, tiny.config)
