"""What a model occupies and streams, computed from its configuration alone (modules built on the meta device:
no weights, no memory), so the doctor can say before loading whether a model fits, and project GPU classes."""

from __future__ import annotations

import functools

import torch

from breeze_worker.model.lm.config import BreezeConfig

RESIDUAL_BYTES = {"fp32": 4, "bf16": 2, "fp16-mixed": 4}  # the caches hold the residual stream's dtype, but
HALF_KV_BYTES = 2  # the backbone's under fp16-mixed with the half_kv setting (engine/precision.py backbone_kv_dtype)
ROWS_PER_SLOT = 2  # a stream slot keeps two rows (cond + uncond) so any stream may use CFG


def _meta_lm(config: BreezeConfig, policy: str):
    from breeze_worker.engine.precision import apply_policy, make_policy
    from breeze_worker.model.lm.breeze import BreezeLM

    with torch.device("meta"):
        lm = BreezeLM(config)
    apply_policy(lm, make_policy(policy, "footprint"))
    return lm


_FIGURES: dict[tuple[str, str], tuple[int, int]] = {}  # (repr of the config, policy) -> figures


def _lm_figures(config: BreezeConfig, policy: str) -> tuple[int, int]:
    """(weight bytes, bytes per frame), built once per configuration and policy (the configs hold dicts, so
    they are keyed by their repr)."""
    from breeze_worker.measure.report import bytes_per_frame

    key = (repr(config), policy)
    if key not in _FIGURES:
        lm = _meta_lm(config, policy)
        weights = sum(p.numel() * p.element_size() for p in lm.parameters())
        _FIGURES[key] = (weights, bytes_per_frame(lm)["total"])
    return _FIGURES[key]


def weight_bytes(config: BreezeConfig, policy: str) -> int:
    """The language model's weights under `policy` (no layer kept in FP32 for overflow)."""
    return _lm_figures(config, policy)[0]


def frame_bytes(config: BreezeConfig, policy: str) -> int:
    """Weight bytes one frame streams under `policy` (measure/report.py `bytes_per_frame`)."""
    return _lm_figures(config, policy)[1]


@functools.lru_cache(maxsize=2)
def codec_bytes(half: bool = False) -> int:
    """The released codec decoder's weights (the encoder is loaded too with a checkpoint; it is small): FP32, or
    with `half` its convolutions' in FP16 (the codec's fp16-mixed precision, model/codec/codec.py)."""
    from breeze_worker.model.codec.config import released_decoder_config
    from breeze_worker.model.codec.decoder import CodecDecoder
    from breeze_worker.model.codec.layers import TwoFormConvolution

    with torch.device("meta"):
        decoder = CodecDecoder(released_decoder_config())
    convolutions = {id(p) for m in decoder.modules() if isinstance(m, TwoFormConvolution) for p in m.parameters()}
    return sum(p.numel() * (2 if half and id(p) in convolutions else 4) for p in decoder.parameters())


def params_per_frame(config: BreezeConfig) -> float:
    """Weights (parameters) one frame streams: the bf16 byte count / 2."""
    return frame_bytes(config, "bf16") / 2.0


def stream_bytes(config: BreezeConfig, policy: str, capacity: int, half_kv: bool = False) -> int:
    """One stream slot's caches: the backbone's keys and values for `capacity` positions and the depth
    decoder's for one frame's 16 positions, for `ROWS_PER_SLOT` rows; `half_kv`: the backbone's in FP16 under
    fp16-mixed (the worker's default where the weights allow it)."""
    bb, dd = config.backbone, config.depth
    residual = RESIDUAL_BYTES[policy]
    backbone = HALF_KV_BYTES if half_kv and policy == "fp16-mixed" else residual
    per_row = 2 * (bb.num_hidden_layers * bb.num_key_value_heads * bb.head_dim * capacity * backbone
                   + dd.num_hidden_layers * dd.num_key_value_heads * dd.head_dim * config.num_codebooks * residual)
    return ROWS_PER_SLOT * per_row
