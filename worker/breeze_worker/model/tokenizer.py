"""The Gemma-3 tokenizer with Breeze's added tokens, over `tokenizers.Tokenizer`.

Loaded from the checkpoint's tokenizer.json, or built in code for the tiny default: a byte-fallback
BPE with single-character pieces (any text, CJK included, round-trips through bytes), the Gemma
normalizer (spaces -> "▁"), a "<bos> $A" post-processor, and the same special tokens as the real one:
<pad>, <eos>, <bos>, <|AUDIO|>, <|audio_eos|>, [S0]..[S9], <ins_bos>, <ins_eos>. Every special id is
taken from the model config and checked against the tokenizer, never assumed.
"""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from breeze_worker.errors import CheckpointError
from breeze_worker.model.lm.config import BreezeConfig

AUDIO_TOKEN = "<|AUDIO|>"
AUDIO_EOS_TOKEN = "<|audio_eos|>"
BOS, EOS, PAD = "<bos>", "<eos>", "<pad>"


class BreezeTokenizer:
    def __init__(self, tokenizer: Tokenizer, config: BreezeConfig):
        self.tokenizer = tokenizer
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
        if self.vocab_size > config.text_encoder.vocab_size:
            raise CheckpointError(f"tokenizer.json has {self.vocab_size} tokens, more than the text encoder's "
                                  f"embedding ({config.text_encoder.vocab_size} rows)")

    # ---- construction ----
    @classmethod
    def from_file(cls, path: str | Path, config: BreezeConfig) -> "BreezeTokenizer":
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise CheckpointError(f"cannot read the tokenizer {path}: {exc}") from exc
        return cls(tokenizer, config)

    @classmethod
    def tiny(cls, config: BreezeConfig) -> "BreezeTokenizer":
        return cls(build_tiny_tokenizer(config), config)

    # ---- use ----
    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids; `add_special_tokens` applies the post-processor (prepends <bos>)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def to_str(self) -> str:
        """The tokenizer.json text."""
        return self.tokenizer.to_str()


def build_tiny_tokenizer(config: BreezeConfig) -> Tokenizer:
    """A small Gemma-shaped tokenizer whose special ids are the config's (filler tokens fill any gap)."""
    fixed = {PAD: config.pad_token_id, EOS: config.eos_token_id, BOS: config.bos_token_id,
             AUDIO_TOKEN: config.audio_token_id, AUDIO_EOS_TOKEN: config.audio_eos_token_id,
             **config.speaker_token_ids}
    if config.ins_bos_token_id is not None:
        fixed[config.ins_bos_token] = config.ins_bos_token_id
    if config.ins_eos_token_id is not None:
        fixed[config.ins_eos_token] = config.ins_eos_token_id
    eoi = config.text_encoder.eoi_token_index
    pieces = ["<unk>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581", *string.ascii_letters]
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
    model = models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, config.bos_token_id)])
    specials = [t for t in vocab if t in fixed or t in ("<end_of_image>", "<unk>")]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tokenizer
