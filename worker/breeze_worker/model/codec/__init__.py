"""The Qwen3-TTS-Tokenizer-12Hz codec: decoder (codes -> 24 kHz PCM) and encoder (reference audio -> codes).

Public API: `Codec` (decode / streaming decode / encode, always FP32), `load_codec(audio_tokenizer_dir,
device)`, `tiny_codec(seed, device)`, `write_codec_checkpoint(codec, dir)`, `DecoderStreamState`.
"""

from breeze_worker.model.codec.codec import Codec
from breeze_worker.model.codec.config import CodecConfig, DecoderConfig, tiny_codec_config
from breeze_worker.model.codec.loader import load_codec
from breeze_worker.model.codec.streaming import DecoderStreamState
from breeze_worker.model.codec.tiny import tiny_codec, write_codec_checkpoint

__all__ = [
    "Codec",
    "CodecConfig",
    "DecoderConfig",
    "DecoderStreamState",
    "load_codec",
    "tiny_codec",
    "tiny_codec_config",
    "write_codec_checkpoint",
]
