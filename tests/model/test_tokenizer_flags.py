"""tokenizer_config.json's flags read as the official code's stack reads them (model/tokenizer.py), where
transformers 5 reads them otherwise:

- against transformers 4.57.3 itself (the official loader's line): tests/fixtures/tokenizer_golden/golden.json
  holds its ids and decoded text for each layout of layouts.json (scripts/make_tokenizer_golden.py ran it in a
  separate environment); the layouts are rebuilt here on the same tiny tokenizer.json (its SHA-256 is checked);
- each flag against an implementation of the current environment that we did not write: the bos/eos flags
  against the `tokenizers` library's own template post-processor on the unmodified tokenizer.json, the clean-up
  against transformers 5's `clean_up_tokenization`, the per-token strip flags against transformers 5's
  AutoTokenizer (which reads them as 4.57.3 does);
- and the prompt the recipe builds (model/prompts.py) follows the flags.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, processors
from transformers import AutoTokenizer

from breeze_worker.model import prompts
from breeze_worker.model.tokenizer import BreezeTokenizer, TokenizerFlags, clean_up_spaces

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tokenizer_golden"
LAYOUTS = json.loads((FIXTURE / "layouts.json").read_text(encoding="utf-8"))
GOLDEN = json.loads((FIXTURE / "golden.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def layouts(tiny, tmp_path_factory) -> dict[str, Path]:
    text = tiny.tokenizer.to_str()
    assert hashlib.sha256(text.encode()).hexdigest() == GOLDEN["tokenizer_json_sha256"], (
        "the tiny tokenizer changed: regenerate the fixture with scripts/make_tokenizer_golden.py")
    root = tmp_path_factory.mktemp("layouts")
    out = {}
    for name, layout in LAYOUTS["layouts"].items():
        directory = root / name
        directory.mkdir()
        spec = json.loads(text)
        if "post_processor" in layout:
            spec["post_processor"] = layout["post_processor"]
        (directory / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
        (directory / "tokenizer_config.json").write_text(json.dumps(layout["config"]), encoding="utf-8")
        out[name] = directory
    return out


@pytest.mark.parametrize("name", sorted(LAYOUTS["layouts"]))
def test_every_layout_reads_as_transformers_4_reads_it(tiny, layouts, name):
    assert GOLDEN["transformers"] == "4.57.3"
    ours = BreezeTokenizer.from_checkpoint(layouts[name], tiny.config)
    for text, want in GOLDEN["layouts"][name]["samples"].items():
        assert ours.encode(text, add_special_tokens=True) == want["special"], (name, text)
        assert ours.encode(text) == want["plain"], (name, text)
        assert ours.decode(want["special"]) == want["decoded"], (name, text)


def test_the_flags_that_differ_from_transformers_5_do_differ(tiny, layouts):
    """The fixture's layouts exercise a real difference: transformers 5 reads these otherwise."""
    text = "Hello world ."
    for name in ("bos-off", "eos-on", "no-post-processor", "clean-up-on"):
        theirs = AutoTokenizer.from_pretrained(str(layouts[name]))
        golden = GOLDEN["layouts"][name]["samples"][text]
        assert (theirs.encode(text, add_special_tokens=True), theirs.decode(golden["special"])) != (
            golden["special"], golden["decoded"]), name


@pytest.mark.parametrize("name, bos, eos", [("bos-off", False, False), ("eos-on", True, True),
                                            ("no-post-processor", True, False), ("bos-on-eos-off", True, False)])
def test_bos_and_eos_flags_against_the_tokenizers_librarys_template(tiny, layouts, name, bos, eos):
    ours = BreezeTokenizer.from_checkpoint(layouts[name], tiny.config)
    assert (ours.flags.add_bos_token, ours.flags.add_eos_token) == (bos, eos)
    library = Tokenizer.from_str(tiny.tokenizer.to_str())
    single = " ".join((["<bos>"] if bos else []) + ["$A"] + (["<eos>"] if eos else []))
    library.post_processor = processors.TemplateProcessing(single=single, special_tokens=[("<bos>", 2), ("<eos>", 1)])
    for text in LAYOUTS["samples"]:
        assert ours.encode(text, add_special_tokens=True) == library.encode(text).ids, (name, text)


def test_another_tokenizer_class_keeps_tokenizer_json_s_post_processor(tiny, layouts):
    ours = BreezeTokenizer.from_checkpoint(layouts["another-class"], tiny.config)
    assert ours.flags == TokenizerFlags() and ours.encode("hi", True) == ours.encode("hi")  # no post-processor


def test_clean_up_against_transformers_own(tiny, layouts):
    theirs = AutoTokenizer.from_pretrained(str(layouts["clean-up-off"]))
    texts = LAYOUTS["samples"] + ["a . b , c ? d ! e ' f n't g 's h 'm i 've j 're k", " .  ,", "no change"]
    for text in texts:
        assert clean_up_spaces(text) == theirs.clean_up_tokenization(text), text
    on = BreezeTokenizer.from_checkpoint(layouts["clean-up-on"], tiny.config)
    off = BreezeTokenizer.from_checkpoint(layouts["clean-up-off"], tiny.config)
    ids = on.encode("Hello world , ok ?")
    assert on.decode(ids) == "Hello world, ok?" and off.decode(ids) == "Hello world , ok ?"


def test_strip_flags_against_transformers_5(tiny, layouts):
    """A declared token's lstrip/rstrip from the config win over tokenizer.json's (both transformers lines agree)."""
    ours = BreezeTokenizer.from_checkpoint(layouts["strip-flags"], tiny.config)
    theirs = AutoTokenizer.from_pretrained(str(layouts["strip-flags"]))
    for text in LAYOUTS["samples"]:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text
    assert ours.encode("x <ins_eos>   y") != BreezeTokenizer.from_checkpoint(layouts["as-shipped"],
                                                                           tiny.config).encode("x <ins_eos>   y")


def test_the_prompt_follows_the_flags(tiny, layouts):
    """The recipe encodes each segment with special tokens and decodes it back (model/prompts.py): with bos off
    there is no mid-prompt <bos>, with eos on an <eos> ends each segment, with clean-up the text changes."""
    segments = prompts.positive_segments("clone", "Hello world , ok ?", instruction=None, transcript="a reference .",
                                         reference_frames=2)
    built = {name: prompts.build_prompt(BreezeTokenizer.from_checkpoint(layouts[name], tiny.config), segments)
             for name in ("as-shipped", "bos-off", "eos-on", "clean-up-on")}
    bos, eos = tiny.config.bos_token_id, tiny.config.eos_token_id
    assert built["as-shipped"].input_ids.count(bos) == 2 and eos not in built["as-shipped"].input_ids
    assert bos not in built["bos-off"].input_ids
    assert built["eos-on"].input_ids.count(eos) == 2
    shipped = BreezeTokenizer.from_checkpoint(layouts["as-shipped"], tiny.config)
    assert "Hello world, ok?" in shipped.decode(built["clean-up-on"].input_ids)
    assert "Hello world , ok ?" in shipped.decode(built["as-shipped"].input_ids)
