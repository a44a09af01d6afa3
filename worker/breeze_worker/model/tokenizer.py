"""The Gemma-3 tokenizer with Breeze's added tokens, over `tokenizers.Tokenizer`.

Loaded from the checkpoint's tokenizer.json plus its tokenizer_config.json the way the official code's stack
(transformers 4, whose GemmaTokenizerFast it loads; transformers 5 cannot load the official model) reads them
(`apply_tokenizer_config`): tokens declared in the config's `added_tokens_decoder`, and the named special
tokens, become added tokens, so a marker declared only there is still read as one token, not as its bytes,
and a declared token's own `lstrip` / `rstrip` / `single_word` / `normalized` flags win over tokenizer.json's.
Where transformers 5 reads the same files differently, the official stack's reading is followed
(`TokenizerFlags`, checked against transformers 4.57.3's output in tests/fixtures/tokenizer_golden):
- with a Gemma tokenizer class, what encoding "with special tokens" adds is built from `add_bos_token`
  (default on) and `add_eos_token` (default off), whatever tokenizer.json's post-processor says
  (transformers 5 keeps tokenizer.json's and ignores both flags);
- `clean_up_tokenization_spaces: true` removes the space before . , ? ! and before the English contractions
  when decoding (transformers 5 refuses to for BPE tokenizers such as Gemma's). The prompt recipe decodes each
  segment back to text (model/prompts.py), so this reaches the prompt.
Or built in code for the tiny default: a byte-fallback
BPE with single-character pieces (any text, CJK included, round-trips through bytes), the Gemma
normalizer (spaces -> "▁"), a "<bos> $A" post-processor, and the same special tokens as the real one:
<pad>, <eos>, <bos>, <|AUDIO|>, <|audio_eos|>, [S0]..[S9], <ins_bos>, <ins_eos>. Every special id is
taken from the model config and checked against the tokenizer, never assumed: each marker the prompt
templates use must tokenize to exactly its one id, or the checkpoint is refused.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from breeze_worker.errors import CheckpointError
from breeze_worker.model.lm.config import BreezeConfig

AUDIO_TOKEN = "<|AUDIO|>"
AUDIO_EOS_TOKEN = "<|audio_eos|>"
BOS, EOS, PAD = "<bos>", "<eos>", "<pad>"


# tokenizer classes whose transformers 4 fast tokenizer builds its own post-processor from the bos/eos flags
_FLAG_POST_PROCESSOR_CLASSES = ("GemmaTokenizer", "GemmaTokenizerFast")
# transformers' clean-up of tokenization spaces, as (what, by what), applied in this order
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


@dataclass(frozen=True)
class TokenizerFlags:
    """tokenizer_config.json's flags as the official code's stack applies them (module docstring)."""

    add_bos_token: bool | None = None  # None: tokenizer.json's post-processor decides
    add_eos_token: bool | None = None
    clean_up_tokenization_spaces: bool = False

    @classmethod
    def from_config(cls, settings: dict, where: Path) -> TokenizerFlags:
        def flag(key: str, default):
            value = settings.get(key, default)
            if value is not None and not isinstance(value, bool):
                raise CheckpointError(f"{where}: {key} must be true or false, not {value!r}")
            return value

        rebuilds = settings.get("tokenizer_class") in _FLAG_POST_PROCESSOR_CLASSES
        return cls(add_bos_token=flag("add_bos_token", True if rebuilds else None),
                   add_eos_token=flag("add_eos_token", False if rebuilds else None),
                   clean_up_tokenization_spaces=bool(flag("clean_up_tokenization_spaces", False)))


def clean_up_spaces(text: str) -> str:
    """The space before punctuation and English contractions removed (`clean_up_tokenization_spaces`)."""
    for what, by in _CLEAN_UP:
        text = text.replace(what, by)
    return text


class BreezeTokenizer:
    def __init__(self, tokenizer: Tokenizer, config: BreezeConfig, flags: TokenizerFlags | None = None):
        self.tokenizer = tokenizer
        self.flags = flags or TokenizerFlags()
        self.bos_id, self.eos_id, self.pad_id = config.bos_token_id, config.eos_token_id, config.pad_token_id
        self.audio_token_id, self.audio_eos_token_id = config.audio_token_id, config.audio_eos_token_id
        self._check(config)

    def _check(self, config: BreezeConfig) -> None:
        expected = {BOS: self.bos_id, EOS: self.eos_id, PAD: self.pad_id, AUDIO_TOKEN: self.audio_token_id,
                    AUDIO_EOS_TOKEN: self.audio_eos_token_id, **config.speaker_token_ids}
        if config.ins_bos_token_id is not None:
            expected[config.ins_bos_token] = config.ins_bos_token_id
        if config.ins_eos_token_id is not None:
            expected[config.ins_eos_token] = config.ins_eos_token_id
        for token, want in expected.items():
            got = self.tokenizer.token_to_id(token)
            if got != want:
                raise CheckpointError(f"tokenizer.json maps {token!r} to {got}, config.json says {want}: "
                                      "the tokenizer does not belong to this checkpoint")
            # in the vocabulary is not enough: unless it is an added token, text holding it is split into pieces
            pieces = self.tokenizer.encode(token, add_special_tokens=False).ids
            if pieces != [want]:
                raise CheckpointError(
                    f"the tokenizer reads the prompt marker {token!r} as {len(pieces)} tokens {pieces[:8]}, not as "
                    f"its one id {want}: declare it as an added (special) token in tokenizer.json or in "
                    "tokenizer_config.json's added_tokens_decoder")
        if self.vocab_size > config.text_encoder.vocab_size:
            raise CheckpointError(f"tokenizer.json has {self.vocab_size} tokens, more than the text encoder's "
                                  f"embedding ({config.text_encoder.vocab_size} rows)")

    # ---- construction ----
    @classmethod
    def from_checkpoint(cls, directory: str | Path, config: BreezeConfig) -> BreezeTokenizer:
        """tokenizer.json, completed by tokenizer_config.json where the checkpoint has one."""
        directory = Path(directory)
        path = directory / "tokenizer.json"
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise CheckpointError(f"cannot read the tokenizer {path}: {exc}") from exc
        config_path = directory / "tokenizer_config.json"
        if config_path.is_file():
            try:
                settings = json.loads(config_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise CheckpointError(f"cannot read {config_path}: {exc}") from exc
            if not isinstance(settings, dict):
                raise CheckpointError(f"{config_path} must hold a JSON object")
            flags = apply_tokenizer_config(tokenizer, settings, config_path)
            return cls(tokenizer, config, flags)
        return cls(tokenizer, config)

    @classmethod
    def tiny(cls, config: BreezeConfig, words: Iterable[str] = ()) -> BreezeTokenizer:
        return cls(build_tiny_tokenizer(config, words), config)

    # ---- use ----
    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids; `add_special_tokens` applies the post-processor (prepends <bos>)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids without special tokens, and each token's (start, end) character offsets in `text`."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        return clean_up_spaces(text) if self.flags.clean_up_tokenization_spaces else text

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def to_str(self) -> str:
        """The tokenizer.json text."""
        return self.tokenizer.to_str()


# tokenizer_config.json keys naming special tokens (transformers adds each as a special token)
_NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
_EXTRA_SPECIAL = ("additional_special_tokens", "extra_special_tokens")


def _added_token(spec: Any, where: Path, special: bool | None = None) -> AddedToken:
    """An AddedToken from a config entry: a string, or a dict with content and its matching flags."""
    if isinstance(spec, str):
        return AddedToken(spec, special=True, normalized=False)
    if not isinstance(spec, dict) or not isinstance(spec.get("content"), str):
        raise CheckpointError(f"{where}: a token entry must be a string or an object with 'content', got {spec!r:.80}")
    flags = {k: bool(spec[k]) for k in ("single_word", "lstrip", "rstrip", "normalized", "special") if k in spec}
    if special is not None:
        flags["special"] = special
    return AddedToken(spec["content"], **flags)


def apply_tokenizer_config(tokenizer: Tokenizer, settings: dict, where: Path) -> TokenizerFlags:
    """Complete `tokenizer` (from tokenizer.json) with tokenizer_config.json, as the official code's stack does
    (module docstring); returns the flags decoding needs:

    - each `added_tokens_decoder` entry (id -> token with its flags), in id order, and then every named
      special token (`bos_token`, ...) and extra special token, that is not yet an added token becomes one;
      an entry already added by tokenizer.json takes the entry's flags; an entry's declared id must be the id
      the tokenizer then gives it;
    - with a Gemma tokenizer class the post-processor is rebuilt from `add_bos_token` / `add_eos_token`.
    """
    declared = settings.get("added_tokens_decoder") or {}
    if not isinstance(declared, dict):
        raise CheckpointError(f"{where}: added_tokens_decoder must map ids to tokens")
    try:
        by_id = sorted((int(i), _added_token(spec, where)) for i, spec in declared.items())
    except ValueError as exc:
        raise CheckpointError(f"{where}: added_tokens_decoder keys must be token ids ({exc})") from exc
    present = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    wanted = [token for _, token in by_id]
    for key in _NAMED_SPECIAL:
        if settings.get(key) is not None:
            wanted.append(_added_token(settings[key], where, special=True))
    for key in _EXTRA_SPECIAL:
        extra = settings.get(key) or []
        for spec in (extra.values() if isinstance(extra, dict) else extra):
            wanted.append(_added_token(spec, where, special=True))
    new, seen = [], set(present)
    for token in wanted:
        if token.content not in seen:
            new.append(token)
            seen.add(token.content)
    if new:
        tokenizer.add_tokens(new)
    restated = [token for _, token in by_id if token.content in present]
    if restated:  # the config's flags win; tokenizers updates an added token in place (same id)
        tokenizer.add_tokens(restated)
    for token_id, token in by_id:
        got = tokenizer.token_to_id(token.content)
        if got != token_id:
            raise CheckpointError(f"{where} declares {token.content!r} as id {token_id}, but the tokenizer gives it "
                                  f"{got}: tokenizer.json and tokenizer_config.json do not belong together")
    flags = TokenizerFlags.from_config(settings, where)
    if flags.add_bos_token is not None or flags.add_eos_token is not None:
        tokenizer.post_processor = _special_tokens_processor(tokenizer, settings, flags, where)
    return flags


def _special_tokens_processor(tokenizer: Tokenizer, settings: dict, flags: TokenizerFlags, where: Path):
    """`<bos>` before and `<eos>` after each sequence as the flags say (the tokens the config names)."""
    names = {}
    for key, default, wanted in (("bos_token", BOS, flags.add_bos_token), ("eos_token", EOS, flags.add_eos_token)):
        spec = settings.get(key) or default
        name = spec["content"] if isinstance(spec, dict) else str(spec)
        if wanted and tokenizer.token_to_id(name) is None:
            raise CheckpointError(f"{where}: {key} {name!r} is not in the tokenizer")
        names[key] = name if wanted else None
    bos, eos = names["bos_token"], names["eos_token"]

    def template(sequence: str, type_id: int) -> str:
        parts = [f"{bos}:{type_id}"] if bos else []
        parts.append(f"${sequence}:{type_id}")
        return " ".join(parts + ([f"{eos}:{type_id}"] if eos else []))

    specials = [(name, tokenizer.token_to_id(name)) for name in (bos, eos) if name]
    return processors.TemplateProcessing(single=template("A", 0), pair=f"{template('A', 0)} {template('B', 1)}",
                                         special_tokens=specials)


def build_tiny_tokenizer(config: BreezeConfig, words: Iterable[str] = ()) -> Tokenizer:
    """A small Gemma-shaped tokenizer whose special ids are the config's (filler tokens fill any gap).

    Without `words` it spells text letter by letter (bytes for anything else). Each of `words` becomes one
    token when it follows a space ("▁word", as a SentencePiece vocabulary of Gemma's size has its
    common words): BPE merges that grow it from its first letter, so a merge never joins letters inside
    another word. A synthetic checkpoint gives its tokenizer common words so that its prompts have about
    the token counts a real checkpoint's have (the text encoder's cost follows them)."""
    fixed = {PAD: config.pad_token_id, EOS: config.eos_token_id, BOS: config.bos_token_id,
             AUDIO_TOKEN: config.audio_token_id, AUDIO_EOS_TOKEN: config.audio_eos_token_id,
             **config.speaker_token_ids}
    if config.ins_bos_token_id is not None:
        fixed[config.ins_bos_token] = config.ins_bos_token_id
    if config.ins_eos_token_id is not None:
        fixed[config.ins_eos_token] = config.ins_eos_token_id
    eoi = config.text_encoder.eoi_token_index
    merges: list[tuple[str, str]] = []
    grown: list[str] = []
    for word in dict.fromkeys(words):  # in order, once each
        piece = "\u2581"
        for char in word:
            if piece + char not in grown:
                merges.append((piece, char))
                grown.append(piece + char)
            piece += char
    pieces = ["<unk>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581", *string.ascii_letters,
              *sorted(set("".join(words)) - set(string.ascii_letters)), *grown]
    vocab: dict[str, int] = dict(fixed)
    used = set(fixed.values())
    if eoi not in used:
        vocab["<end_of_image>"] = eoi
        used.add(eoi)
    next_id = 0
    for piece in pieces:
        while next_id in used:
            next_id += 1
        vocab[piece] = next_id
        used.add(next_id)
    top = max(used)
    for filler in range(top + 1):  # no holes: tokenizers wants dense ids
        if filler not in used:
            vocab[f"<unused{filler}>"] = filler
    if max(vocab.values()) >= config.text_vocab_size:
        raise ValueError(f"{len(grown)} word pieces do not fit a text vocabulary of {config.text_vocab_size}")
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, config.bos_token_id)])
    specials = [t for t in vocab if t in fixed or t in ("<end_of_image>", "<unk>")]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tokenizer
