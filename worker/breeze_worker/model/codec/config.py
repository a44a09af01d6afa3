"""Configuration of the 12 Hz codec, parsed from (and written back to) `audio_tokenizer/config.json`.

The checkpoint's file is the Qwen3-TTS-Tokenizer-12Hz layout: top-level rates and quantizer count, a
`decoder_config` block (our decoder) and an `encoder_config` block (a Mimi configuration, handed to
transformers' `MimiConfig` as is). Unknown keys are ignored, so the generic keys transformers writes into
every config do not matter.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from breeze_worker.errors import CheckpointError

MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
ARCHITECTURE = "Qwen3TTSTokenizerV2Model"


@dataclass(frozen=True)
class DecoderConfig:
    """Hyper-parameters of the codec decoder (codes -> waveform); field names follow the checkpoint.

    A key absent from `decoder_config` gets the value the reference implementation (qwen-tts,
    `Qwen3TTSTokenizerV2DecoderConfig`) gives it, not the released checkpoint's: the released sizes are
    `released_decoder_config()`. Two keys have no reference default: `codebook_dim` (the reference fails
    without it, so do we, by name) and `head_dim` (absent: hidden_size // num_attention_heads, as the
    reference's attention derives it).
    """

    codebook_dim: int | None = None  # width after dequantization; each codebook entry is codebook_dim // 2 wide
    codebook_size: int = 2048
    num_quantizers: int = 16
    latent_dim: int = 1024
    hidden_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    upsampling_ratios: tuple[int, ...] = (2, 2)
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    decoder_dim: int = 1536

    @property
    def required_codebook_dim(self) -> int:
        """`codebook_dim`, which a decoder cannot be built without (`validate` requires it too)."""
        if self.codebook_dim is None:
            raise CheckpointError("audio_tokenizer decoder_config: codebook_dim is required")
        return self.codebook_dim

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DecoderConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        if values.get("codebook_dim") is None:
            raise CheckpointError("audio_tokenizer decoder_config has no 'codebook_dim' (the reference codec "
                                  "cannot be built without it either)")
        scaling = raw.get("rope_scaling")
        if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise CheckpointError(f"audio_tokenizer decoder_config asks for rope_scaling {scaling!r:.80}; this "
                                  "worker implements the codec's default rotary embedding only")
        for name in ("upsampling_ratios", "upsample_rates"):
            if name in values:
                values[name] = tuple(int(x) for x in values[name])
        config = cls(**values)
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["upsampling_ratios"] = list(self.upsampling_ratios)
        out["upsample_rates"] = list(self.upsample_rates)
        return out

    def validate(self) -> None:
        problems = []
        if self.codebook_dim is None:
            problems.append("codebook_dim is required")
        elif self.codebook_dim % 2:
            problems.append(f"codebook_dim {self.codebook_dim} must be even")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append("num_attention_heads must be a multiple of num_key_value_heads")
        if self.sliding_window < 1:
            problems.append("sliding_window must be at least 1")
        if self.decoder_dim % (2 ** len(self.upsample_rates)):
            problems.append(f"decoder_dim {self.decoder_dim} must halve {len(self.upsample_rates)} times")
        if self.hidden_act not in ACTIVATIONS:
            problems.append(f"hidden_act {self.hidden_act!r} is not one of {sorted(ACTIVATIONS)}")
        if problems:
            raise CheckpointError("audio_tokenizer decoder_config: " + "; ".join(problems))


ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "relu")


def released_decoder_config() -> DecoderConfig:
    """The decoder of the released Qwen3-TTS-Tokenizer-12Hz (Breeze TTS 2's `audio_tokenizer/`): the keys where
    it differs from the reference's defaults are spelled out in its config.json, as here."""
    return DecoderConfig(codebook_dim=512, hidden_size=512, head_dim=64, intermediate_size=1024)


@dataclass(frozen=True)
class CodecConfig:
    """The whole codec: decoder hyper-parameters, the Mimi encoder's config dict and the rates."""

    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    encoder: dict[str, Any] = field(default_factory=dict)  # a MimiConfig as a dict
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> CodecConfig:
        model_type = raw.get("model_type")
        if model_type not in (None, MODEL_TYPE):
            raise CheckpointError(
                f"audio_tokenizer/config.json has model_type {model_type!r}; expected {MODEL_TYPE!r} "
                "(the Qwen3-TTS-Tokenizer-12Hz codec)"
            )
        if "decoder_config" not in raw or "encoder_config" not in raw:
            raise CheckpointError("audio_tokenizer/config.json needs both 'decoder_config' and 'encoder_config'")
        config = cls(
            decoder=DecoderConfig.from_dict(raw["decoder_config"]),
            encoder=dict(raw["encoder_config"]),
            encoder_valid_num_quantizers=int(raw.get("encoder_valid_num_quantizers", 16)),
            input_sample_rate=int(raw.get("input_sample_rate", 24000)),
            output_sample_rate=int(raw.get("output_sample_rate", 24000)),
            decode_upsample_rate=int(raw.get("decode_upsample_rate", 1920)),
            encode_downsample_rate=int(raw.get("encode_downsample_rate", 1920)),
        )
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        """The official `audio_tokenizer/config.json` layout."""
        return {
            "architectures": [ARCHITECTURE],
            "model_type": MODEL_TYPE,
            "encoder_valid_num_quantizers": self.encoder_valid_num_quantizers,
            "input_sample_rate": self.input_sample_rate,
            "output_sample_rate": self.output_sample_rate,
            "decode_upsample_rate": self.decode_upsample_rate,
            "encode_downsample_rate": self.encode_downsample_rate,
            "encoder_config": dict(self.encoder),
            "decoder_config": self.decoder.to_dict(),
        }

    def validate(self) -> None:
        problems = []
        if self.decoder.samples_per_frame != self.decode_upsample_rate:
            problems.append(
                f"decoder upsampling gives {self.decoder.samples_per_frame} samples per frame but "
                f"decode_upsample_rate is {self.decode_upsample_rate}"
            )
        if self.decoder.num_quantizers != self.encoder_valid_num_quantizers:
            problems.append(
                f"decoder has {self.decoder.num_quantizers} codebooks but the encoder keeps "
                f"{self.encoder_valid_num_quantizers}"
            )
        if int(self.encoder.get("num_quantizers", 32)) < self.encoder_valid_num_quantizers:
            problems.append("encoder_config.num_quantizers is below encoder_valid_num_quantizers")
        if self.input_sample_rate != self.output_sample_rate:
            problems.append("input and output sample rates differ; this worker expects one rate")
        if problems:
            raise CheckpointError("audio_tokenizer/config.json: " + "; ".join(problems))


def tiny_codec_config(codebook_size: int = 2048, encoder_quantizers: int = 18) -> CodecConfig:
    """A tiny codec with the real frame geometry (24 kHz, 1920 samples per frame, 16 codebooks).

    Widths are tiny. The decoder's sliding window (4 frames) is short so that a few frames exercise it;
    the encoder's (8 steps) is short so that the golden test proves it is NOT applied, as in the
    reference (see encoder.py). `codebook_size` 2048 accepts every code the language model emits; the
    golden fixture uses a smaller one to stay small. The encoder keeps 18 quantizers, of which the
    first 16 are used, as the real one keeps 32.
    """
    decoder = DecoderConfig(
        codebook_size=codebook_size,
        codebook_dim=16,
        latent_dim=24,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,  # not hidden_size // heads, as in the real checkpoint (512 / 16 heads, head_dim 64)
        intermediate_size=48,
        sliding_window=4,
        decoder_dim=32,
    )
    encoder = {
        "sampling_rate": 24000,
        "audio_channels": 1,
        "hidden_size": 32,
        "num_filters": 2,
        "num_residual_layers": 1,
        "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7,
        "last_kernel_size": 3,
        "residual_kernel_size": 3,
        "dilation_growth_rate": 2,
        "use_causal_conv": True,
        "pad_mode": "constant",
        "compress": 2,
        "trim_right_ratio": 1.0,
        "codebook_size": 1 << (codebook_size.bit_length() - 1),  # Mimi needs a power of two <= the decoder's
        "codebook_dim": 8,
        "num_quantizers": encoder_quantizers,
        "num_semantic_quantizers": 1,
        "use_conv_shortcut": False,
        "vector_quantization_hidden_dimension": 8,
        "upsample_groups": 32,  # must divide hidden_size
        "num_hidden_layers": 1,
        "intermediate_size": 48,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "gelu",
        "max_position_embeddings": 8000,
        "norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "sliding_window": 8,
        "layer_scale_initial_scale": 0.01,
        "attention_bias": False,
        "use_cache": False,
        "model_type": "mimi",
    }
    return CodecConfig(decoder=decoder, encoder=encoder)
