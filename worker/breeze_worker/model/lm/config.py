"""Typed configuration of the Breeze TTS 2 language model, parsed from the checkpoint's config.json.

The checkpoint's config.json carries three sub-configs that hold the real hyper-parameters:
`text_encoder_config` (T5Gemma2 text encoder), `backbone_config` (Qwen3) and `depth_decoder_config`
(Llama with llama3 RoPE scaling). Its top-level `rope_theta`, `rope_scaling`, `rms_norm_eps`,
`max_position_embeddings` (and the leftover Mimi `codec_config`, apart from its `codebook_size`) are
decoys from the model's history: they are written back by `to_dict` but never read.

`BreezeConfig.full_size()` gives the real sizes; `BreezeConfig.tiny()` the same architecture at sizes
where a frame takes milliseconds on a CPU (the embedded default and the tests).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from breeze_worker.errors import CheckpointError

# top-level keys of the official config.json that look meaningful but are ignored (history leftovers)
DECOY_KEYS = ("rope_theta", "rope_scaling", "rms_norm_eps", "max_position_embeddings")


@dataclass(frozen=True)
class TextEncoderConfig:
    """T5Gemma2 text encoder (bidirectional, alternating sliding / full attention layers)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    rope_parameters: dict[str, dict[str, Any]]  # per layer type: rope_type (default|linear), rope_theta, factor
    sliding_window: int = 512
    query_pre_attn_scalar: float = 256
    rms_norm_eps: float = 1e-6
    hidden_activation: str = "gelu_pytorch_tanh"
    attention_bias: bool = False
    attn_logit_softcapping: float | None = None
    eoi_token_index: int = 256_000
    pad_token_id: int = 0
    max_position_embeddings: int = 131_072


@dataclass(frozen=True)
class BackboneConfig:
    """Qwen3 decoder (causal, q/k-norm, default RoPE)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    attention_bias: bool = False
    max_position_embeddings: int = 40_960


@dataclass(frozen=True)
class DepthDecoderConfig:
    """Llama decoder over the 16 codebooks of one frame (llama3 RoPE scaling, no q/k-norm)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    backbone_hidden_size: int
    rope_theta: float = 500_000.0
    rope_scaling: dict[str, Any] | None = None  # llama3: factor, low/high_freq_factor, original_max_position_embeddings
    rms_norm_eps: float = 1e-5
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    max_position_embeddings: int = 33


@dataclass(frozen=True)
class BreezeConfig:
    text_encoder: TextEncoderConfig
    backbone: BackboneConfig
    depth: DepthDecoderConfig
    num_codebooks: int = 16
    # per-codebook classes of the depth heads and embedding; lm_head has one more (end of speech)
    vocab_size: int = 2051
    codebook_size: int = 2048  # codes the codec can decode; ids codebook_size..vocab_size-1 are reserved
    text_vocab_size: int = 262_158
    audio_token_id: int = 262_144
    audio_eos_token_id: int = 262_145
    codebook_pad_token_id: int = 2050
    codebook_eos_token_id: int = 0  # the code of every codebook in the <|audio_eos|> frame
    bos_token_id: int = 2
    eos_token_id: int = 1
    pad_token_id: int = 0
    speaker_token_ids: dict[str, int] = field(default_factory=dict)  # "[S0]" -> id
    ins_bos_token: str = "<ins_bos>"
    ins_eos_token: str = "<ins_eos>"
    ins_bos_token_id: int | None = 262_156
    ins_eos_token_id: int | None = 262_157
    tie_codebooks_embeddings: bool = True
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # the parsed config.json

    # ---- derived ----
    @property
    def hidden_size(self) -> int:
        return self.backbone.hidden_size

    @property
    def end_of_speech_id(self) -> int:
        """The lm_head class that ends speech (one past the last code class)."""
        return self.vocab_size

    @property
    def reserved_code_ids(self) -> tuple[int, ...]:
        """Code ids the codec cannot decode; masked out of sampling at the backbone and every depth head."""
        return tuple(range(self.codebook_size, self.vocab_size))

    # ---- construction ----
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BreezeConfig:
        """Parse an official config.json dict; decoy top-level keys are ignored. A missing key or a value of
        the wrong type is a `CheckpointError` naming the key."""
        try:
            return cls._from_dict(_Section(raw, ""))
        except KeyError as exc:
            raise CheckpointError(f"config.json lacks the key {exc}; is this a Breeze TTS 2 checkpoint?") from exc
        except (TypeError, ValueError, AttributeError) as exc:  # a shape the typed reads did not foresee
            raise CheckpointError(f"config.json is malformed: {exc}") from exc

    @classmethod
    def _from_dict(cls, raw: _Section) -> BreezeConfig:
        backbone_type = raw.get("backbone_model_type", "qwen3")
        if backbone_type != "qwen3":
            raise CheckpointError(f"config.json backbone_model_type is {backbone_type!r}; only 'qwen3' is supported")
        proj = raw.get("text_encoder_proj_type", "linear")
        if proj != "linear":
            raise CheckpointError(f"config.json text_encoder_proj_type is {proj!r}; only 'linear' is supported")
        layer_idx = raw.get("text_encoder_feature_layer_idx", -1)
        if layer_idx not in (-1, [-1], (-1,)):
            raise CheckpointError(f"text_encoder_feature_layer_idx {layer_idx!r} is not supported (only -1)")
        te, bb, dd = raw.section("text_encoder_config"), raw.section("backbone_config"), raw.section(
            "depth_decoder_config")
        head_dim = te.integer("head_dim", minimum=1)
        text_encoder = TextEncoderConfig(
            vocab_size=te.integer("vocab_size", minimum=1),
            hidden_size=te.integer("hidden_size", minimum=1),
            intermediate_size=te.integer("intermediate_size", minimum=1),
            num_hidden_layers=te.integer("num_hidden_layers", minimum=1),
            num_attention_heads=te.integer("num_attention_heads", minimum=1),
            num_key_value_heads=te.integer("num_key_value_heads", minimum=1),
            head_dim=head_dim,
            layer_types=te.strings("layer_types"),
            rope_parameters=_text_rope_parameters(te),
            sliding_window=te.integer("sliding_window", 512, minimum=1),
            query_pre_attn_scalar=te.number("query_pre_attn_scalar", head_dim),
            rms_norm_eps=te.number("rms_norm_eps", 1e-6),
            hidden_activation=te.text("hidden_activation", "gelu_pytorch_tanh"),
            attention_bias=te.flag("attention_bias", False),
            attn_logit_softcapping=te.optional_number("attn_logit_softcapping"),
            eoi_token_index=te.integer("eoi_token_index", 256_000),
            pad_token_id=te.integer("pad_token_id", 0),
            max_position_embeddings=te.integer("max_position_embeddings", 131_072, minimum=1),
        )
        if len(text_encoder.layer_types) != text_encoder.num_hidden_layers:
            raise CheckpointError("text_encoder_config.layer_types must list one type per layer")
        if bb.get("rope_scaling"):
            raise CheckpointError("backbone_config.rope_scaling is set; the Qwen3 backbone uses plain RoPE")
        bb_hidden, bb_heads = bb.integer("hidden_size", minimum=1), bb.integer("num_attention_heads", minimum=1)
        backbone = BackboneConfig(
            hidden_size=bb_hidden,
            intermediate_size=bb.integer("intermediate_size", minimum=1),
            num_hidden_layers=bb.integer("num_hidden_layers", minimum=1),
            num_attention_heads=bb_heads,
            num_key_value_heads=bb.integer("num_key_value_heads", minimum=1),
            head_dim=bb.optional_integer("head_dim") or bb_hidden // bb_heads,
            rope_theta=bb.number("rope_theta", 1_000_000.0),
            rms_norm_eps=bb.number("rms_norm_eps", 1e-6),
            hidden_act=bb.text("hidden_act", "silu"),
            attention_bias=bb.flag("attention_bias", False),
            max_position_embeddings=bb.integer("max_position_embeddings", 40_960, minimum=1),
        )
        dd_hidden, dd_heads = dd.integer("hidden_size", minimum=1), dd.integer("num_attention_heads", minimum=1)
        depth = DepthDecoderConfig(
            hidden_size=dd_hidden,
            intermediate_size=dd.integer("intermediate_size", minimum=1),
            num_hidden_layers=dd.integer("num_hidden_layers", minimum=1),
            num_attention_heads=dd_heads,
            num_key_value_heads=dd.integer("num_key_value_heads", minimum=1),
            head_dim=dd.optional_integer("head_dim") or dd_hidden // dd_heads,
            backbone_hidden_size=dd.integer("backbone_hidden_size", backbone.hidden_size),
            rope_theta=dd.number("rope_theta", 500_000.0),
            rope_scaling=copy.deepcopy(dd.optional_section("rope_scaling")),
            rms_norm_eps=dd.number("rms_norm_eps", 1e-5),
            hidden_act=dd.text("hidden_act", "silu"),
            attention_bias=dd.flag("attention_bias", False),
            mlp_bias=dd.flag("mlp_bias", False),
            max_position_embeddings=dd.integer("max_position_embeddings", 33, minimum=1),
        )
        audio_embed = raw.optional_integer("audio_embed_size") or backbone.hidden_size
        if audio_embed != backbone.hidden_size or depth.backbone_hidden_size != backbone.hidden_size:
            raise CheckpointError(
                "audio_embed_size and depth_decoder_config.backbone_hidden_size must equal the backbone hidden "
                f"size {backbone.hidden_size} (got {audio_embed} and {depth.backbone_hidden_size}); projected "
                "audio embeddings are not supported")
        special = _Section(raw.optional_section("text_encoder_special_tokens_config") or {},
                           "text_encoder_special_tokens_config")
        ids_section = _Section(special.optional_section("token_ids") or {}, special.key("token_ids"))
        token_ids = {k: ids_section.integer(k, minimum=0) for k in ids_section.raw}
        speakers = {name: token_ids[name] for name in special.strings("speaker_tokens", ()) if name in token_ids}
        ins = _Section(special.optional_section("instruction_tokens") or {}, special.key("instruction_tokens"))
        ins_bos, ins_eos = ins.text("bos", "<ins_bos>"), ins.text("eos", "<ins_eos>")
        codec = _Section(raw.optional_section("codec_config") or {}, "codec_config")
        vocab_size = raw.integer("vocab_size", minimum=1)
        return cls(
            text_encoder=text_encoder,
            backbone=backbone,
            depth=depth,
            num_codebooks=raw.integer("num_codebooks", 16, minimum=1),
            vocab_size=vocab_size,
            codebook_size=codec.integer("codebook_size", 2048, minimum=1),
            text_vocab_size=raw.integer("text_vocab_size", text_encoder.vocab_size, minimum=1),
            audio_token_id=raw.integer("audio_token_id", minimum=0),
            audio_eos_token_id=raw.integer("audio_eos_token_id", minimum=0),
            codebook_pad_token_id=raw.integer("codebook_pad_token_id", vocab_size - 1, minimum=0),
            codebook_eos_token_id=raw.integer("codebook_eos_token_id", 0, minimum=0),
            bos_token_id=raw.integer("bos_token_id", 2, minimum=0),
            eos_token_id=raw.integer("eos_token_id", 1, minimum=0),
            pad_token_id=raw.integer("pad_token_id", 0, minimum=0),
            speaker_token_ids=speakers,
            ins_bos_token=ins_bos,
            ins_eos_token=ins_eos,
            ins_bos_token_id=token_ids.get(ins_bos),
            ins_eos_token_id=token_ids.get(ins_eos),
            tie_codebooks_embeddings=raw.flag("tie_codebooks_embeddings", True),
            raw=copy.deepcopy(raw.raw),
        )

    def to_dict(self) -> dict[str, Any]:
        """The official config.json layout, decoy top-level keys included (they carry the depth decoder's
        values, as in the released checkpoint, so a loader that reads them gets the backbone wrong)."""
        te = asdict(self.text_encoder)
        te["layer_types"] = list(te["layer_types"])
        te.update(model_type="t5gemma2_text", bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id,
                  dropout_rate=0.0, attention_dropout=0.0)
        bb = asdict(self.backbone)
        bb.update(model_type="qwen3", rope_scaling=None, vocab_size=self.vocab_size + 1)
        dd = asdict(self.depth)
        dd.update(model_type="breeze_depth_decoder", num_codebooks=self.num_codebooks, vocab_size=self.vocab_size,
                  audio_embed_size=self.backbone.hidden_size)
        token_ids = dict(self.speaker_token_ids)
        token_ids.update({"<|AUDIO|>": self.audio_token_id, "<|audio_eos|>": self.audio_eos_token_id})
        if self.ins_bos_token_id is not None:
            token_ids[self.ins_bos_token] = self.ins_bos_token_id
        if self.ins_eos_token_id is not None:
            token_ids[self.ins_eos_token] = self.ins_eos_token_id
        return {
            "architectures": ["BreezeForConditionalGeneration"],
            "model_type": "breeze",
            "backbone_model_type": "qwen3",
            "text_encoder_proj_type": "linear",
            "hidden_size": self.backbone.hidden_size,
            "audio_embed_size": self.backbone.hidden_size,
            "num_codebooks": self.num_codebooks,
            "vocab_size": self.vocab_size,
            "audio_vocab_size": self.vocab_size,
            "text_vocab_size": self.text_vocab_size,
            "audio_token_id": self.audio_token_id,
            "audio_eos_token_id": self.audio_eos_token_id,
            "codebook_pad_token_id": self.codebook_pad_token_id,
            "codebook_eos_token_id": self.codebook_eos_token_id,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "tie_codebooks_embeddings": self.tie_codebooks_embeddings,
            "tie_word_embeddings": False,
            # decoys: leftovers of the model's history, never read
            "rope_theta": 500_000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 2048},
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 2048,
            "text_encoder_config": te,
            "backbone_config": bb,
            "depth_decoder_config": dd,
            "codec_config": {"model_type": "mimi", "codebook_size": self.codebook_size, "sampling_rate": 24000,
                             "num_quantizers": 32, "hidden_size": 512},
            "text_encoder_special_tokens_config": {
                "token_ids": token_ids,
                "speaker_tokens": list(self.speaker_token_ids),
                "instruction_tokens": {"bos": self.ins_bos_token, "eos": self.ins_eos_token},
            },
        }

    # ---- presets ----
    @classmethod
    def full_size(cls) -> BreezeConfig:
        """The released Breeze TTS 2 sizes (see docs: ~2.85 B live parameters)."""
        return cls.from_dict(_preset(
            text=dict(vocab_size=262_158, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                      query_pre_attn_scalar=256, eoi_token_index=256_000,
                      layer_types=["full_attention" if i in (5, 11, 17, 23) else "sliding_attention"
                                   for i in range(26)]),
            backbone=dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                          num_key_value_heads=8, head_dim=128),
            depth=dict(hidden_size=1024, intermediate_size=8192, num_hidden_layers=12, num_attention_heads=8,
                       num_key_value_heads=2, head_dim=128),
            base_vocab=262_144,
        ))

    @classmethod
    def tiny(cls) -> BreezeConfig:
        """The same architecture at toy sizes: 16 codebooks of 2051 classes (the codec's contract), tiny
        transformers, a ~330-token vocabulary, a 6-token sliding window so the window is exercised."""
        return cls.from_dict(_preset(
            text=dict(vocab_size=TINY_BASE_VOCAB + 14, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=6,
                      query_pre_attn_scalar=32, eoi_token_index=TINY_BASE_VOCAB - 1,
                      layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
            backbone=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16),
            depth=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8),
            base_vocab=TINY_BASE_VOCAB,
        ))


# the tiny tokenizer's base vocabulary: 4 specials + 256 byte tokens + "▁" + 52 letters + <end_of_image>
TINY_BASE_VOCAB = 4 + 256 + 1 + 52 + 1


def _text_rope_parameters(te: _Section) -> dict[str, dict[str, Any]]:
    params = _Section(te.optional_section("rope_parameters") or {}, te.key("rope_parameters"))
    out: dict[str, dict[str, Any]] = {}
    for layer_type, default_theta in (("sliding_attention", 10_000.0), ("full_attention", 1_000_000.0)):
        entry = _Section(params.optional_section(layer_type) or {}, params.key(layer_type))
        p = copy.deepcopy(entry.raw)
        p["rope_type"] = entry.text("rope_type", "default")
        p["rope_theta"] = entry.number("rope_theta", default_theta)
        if p["rope_type"] not in ("default", "linear"):
            raise CheckpointError(f"text encoder rope_type {p['rope_type']!r} is not supported (default, linear)")
        if p["rope_type"] == "linear":
            p["factor"] = entry.number("factor")
        out[layer_type] = p
    return out


_REQUIRED = object()


class _Section:
    """Typed reads from one object of config.json: a missing required key or a value of the wrong type is a
    `CheckpointError` naming the file and the key (`backbone_config.num_hidden_layers`), never a bare
    KeyError / TypeError from deep inside the parse."""

    def __init__(self, raw: Any, path: str):
        if not isinstance(raw, dict):
            raise CheckpointError(f"config.json {path or '(top level)'} must be a JSON object, not "
                                  f"{type(raw).__name__}")
        self.raw, self.path = raw, path

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, default: Any = None) -> Any:
        return self.raw.get(name, default)

    def _value(self, name: str, default: Any) -> Any:
        if name in self.raw:
            return self.raw[name]
        if default is _REQUIRED:
            raise CheckpointError(f"config.json lacks the key {self.key(name)!r}; is this a Breeze TTS 2 checkpoint?")
        return default

    def _bad(self, name: str, value: Any, want: str) -> CheckpointError:
        return CheckpointError(f"config.json {self.key(name)} is {value!r}, expected {want}")

    def integer(self, name: str, default: Any = _REQUIRED, *, minimum: int | None = None) -> int:
        value = self._value(name, default)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(name, value, "an integer")
        if minimum is not None and value < minimum:
            raise self._bad(name, value, f"an integer >= {minimum}")
        return value

    def optional_integer(self, name: str) -> int | None:
        return None if self.raw.get(name) is None else self.integer(name)

    def number(self, name: str, default: Any = _REQUIRED) -> float:
        value = self._value(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self._bad(name, value, "a finite number")
        return float(value)

    def optional_number(self, name: str) -> float | None:
        return None if self.raw.get(name) is None else self.number(name)

    def flag(self, name: str, default: Any = _REQUIRED) -> bool:
        value = self._value(name, default)
        if not isinstance(value, bool):
            raise self._bad(name, value, "true or false")
        return value

    def text(self, name: str, default: Any = _REQUIRED) -> str:
        value = self._value(name, default)
        if not isinstance(value, str):
            raise self._bad(name, value, "a string")
        return value

    def strings(self, name: str, default: Any = _REQUIRED) -> tuple[str, ...]:
        value = self._value(name, default)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise self._bad(name, value, "a list of strings")
        return tuple(value)

    def section(self, name: str) -> _Section:
        return _Section(self._value(name, _REQUIRED), self.key(name))

    def optional_section(self, name: str) -> dict[str, Any] | None:
        value = self.raw.get(name)
        if value is not None and not isinstance(value, dict):
            raise self._bad(name, value, "a JSON object or null")
        return value


def _preset(text: dict, backbone: dict, depth: dict, base_vocab: int) -> dict[str, Any]:
    """A config.json dict for given sizes, with the official special-token layout after `base_vocab`."""
    speakers = {f"[S{i}]": base_vocab + 2 + i for i in range(10)}
    te = dict(text, rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                     "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}})
    dd = dict(depth, backbone_hidden_size=backbone["hidden_size"], rope_theta=500_000.0, rms_norm_eps=1e-5,
              max_position_embeddings=33,
              rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 0.001953125,
                            "high_freq_factor": 0.0078125, "original_max_position_embeddings": 16})
    bb = dict(backbone, rope_theta=1_000_000.0, rms_norm_eps=1e-6, rope_scaling=None)
    return {
        "model_type": "breeze", "backbone_model_type": "qwen3", "text_encoder_proj_type": "linear",
        "num_codebooks": 16, "vocab_size": 2051, "text_vocab_size": text["vocab_size"],
        "audio_token_id": base_vocab, "audio_eos_token_id": base_vocab + 1,
        "codebook_pad_token_id": 2050, "codebook_eos_token_id": 0,
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "tie_codebooks_embeddings": True,
        "audio_embed_size": backbone["hidden_size"],
        "text_encoder_config": te, "backbone_config": bb, "depth_decoder_config": dd,
        "codec_config": {"codebook_size": 2048},
        "text_encoder_special_tokens_config": {
            "token_ids": {"<|AUDIO|>": base_vocab, "<|audio_eos|>": base_vocab + 1, **speakers,
                          "<ins_bos>": base_vocab + 12, "<ins_eos>": base_vocab + 13},
            "speaker_tokens": list(speakers),
            "instruction_tokens": {"bos": "<ins_bos>", "eos": "<ins_eos>"},
        },
    }
