"""`audio_tokenizer/` (config.json + model.safetensors) -> `Codec`, streaming tensors one at a time.

The decoder is built on the meta device and materialized on the target device, so no random
initialization is spent on it; each checkpoint tensor is read and copied into place in turn. Every tensor
must match by name and shape: a mismatch raises `CheckpointError` naming what to look at.

The reference encoder (transformers' Mimi) is read when it is first needed (`Codec.load_encoder`; the worker
loads it right after it starts serving): importing transformers and building Mimi is a good part of a
start-up that only requests cloning a voice need. The decoder's tensors are checked at load; the encoder's
when it is read.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from breeze_worker.errors import CheckpointError
from breeze_worker.model.codec.codec import Codec, require_fp32
from breeze_worker.model.codec.config import CodecConfig
from breeze_worker.model.codec.decoder import CodecDecoder
from breeze_worker.model.meta import materialize, no_init

if TYPE_CHECKING:
    from breeze_worker.model.codec.encoder import ReferenceEncoder

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def read_codec_config(audio_tokenizer_dir: str | Path) -> CodecConfig:
    path = Path(audio_tokenizer_dir) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"codec config not found: {path} (expected the checkpoint's audio_tokenizer/ folder)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    return CodecConfig.from_dict(raw)


def build_decoder(config: CodecConfig, device: torch.device | str) -> CodecDecoder:
    """The decoder (uninitialized memory) on `device`, ready to receive weights."""
    with torch.device("meta"), no_init():
        decoder = CodecDecoder(config.decoder)
    materialize(decoder, device)
    return decoder


def build_encoder(config: CodecConfig, device: torch.device | str) -> ReferenceEncoder:
    """The reference encoder (random init) on `device`, ready to receive weights (imports transformers)."""
    from breeze_worker.model.codec.encoder import ReferenceEncoder

    with torch.device(device):
        return ReferenceEncoder(config.encoder, config.encoder_valid_num_quantizers, config.encode_downsample_rate)


def build_codec_modules(config: CodecConfig, device: torch.device | str) -> tuple[CodecDecoder, ReferenceEncoder]:
    """Decoder (uninitialized memory) and encoder (random init) on `device`, ready to receive weights."""
    return build_decoder(config, device), build_encoder(config, device)


def checkpoint_tensors(decoder: CodecDecoder | None, encoder: ReferenceEncoder | None) -> dict[str, torch.Tensor]:
    """Every tensor of the codec's modules given under its checkpoint name (the live tensors, not copies)."""
    tensors = {}
    if decoder is not None:
        tensors.update({f"decoder.{name}": t for name, t in decoder.state_dict(keep_vars=True).items()})
    if encoder is not None:
        for name, t in encoder.state_dict(keep_vars=True).items():
            tensors[type(encoder).checkpoint_key(name)] = t
    return tensors


def load_codec(
    audio_tokenizer_dir: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> Codec:
    """Load the codec in FP32 on `device` (`dtype` is accepted for symmetry and ignored unless float32); its
    reference encoder is read on first use (module docstring)."""
    require_fp32(dtype)
    directory = Path(audio_tokenizer_dir)
    config = read_codec_config(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"codec weights not found: {weights}")
    device = torch.device(device)
    decoder = build_decoder(config, device)
    _fill(weights, checkpoint_tensors(decoder, None), skip=("encoder.",), device=device)
    log.info("codec loaded from %s on %s (float32; its reference encoder when first needed)", directory, device)

    def load_encoder(on: torch.device) -> ReferenceEncoder:
        encoder = build_encoder(config, on)
        _fill(weights, checkpoint_tensors(None, encoder), skip=("decoder.",), device=on)
        encoder.after_load()
        log.info("codec reference encoder loaded from %s on %s", directory, on)
        return encoder

    return Codec(config, decoder, load_encoder)


def _fill(weights: Path, targets: dict[str, torch.Tensor], skip: tuple[str, ...], device: torch.device) -> None:
    """Copy every tensor of `weights` into `targets` by name (those under the `skip` prefixes belong to the
    other module); any missing, unexpected or mis-shaped tensor is a CheckpointError naming them."""
    targets = dict(targets)
    unexpected, misshaped = [], []
    with torch.no_grad(), safe_open(str(weights), framework="pt", device=str(device)) as reader:
        for key in reader.keys():
            if key.startswith(skip):
                continue
            target = targets.pop(key, None)
            if target is None:
                unexpected.append(key)
                continue
            tensor = reader.get_tensor(key)
            if tuple(tensor.shape) != tuple(target.shape):
                misshaped.append(f"{key} {tuple(tensor.shape)} (expected {tuple(target.shape)})")
                continue
            target.copy_(tensor)
    problems = []
    if targets:
        problems.append(f"{len(targets)} missing, e.g. {sorted(targets)[:5]}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected, e.g. {sorted(unexpected)[:5]}")
    if misshaped:
        problems.append(f"{len(misshaped)} mis-shaped, e.g. {misshaped[:5]}")
    if problems:
        raise CheckpointError(f"{weights} does not match its config.json: " + "; ".join(problems))
