"""The `Codec` facade the engine uses: decode codes to 24 kHz PCM (one-shot or streaming), encode references.

The codec runs in FP32 whatever the language model's precision (SnakeBeta's `exp` overflows in BF16/FP16),
in one of two precisions (`CODEC_PRECISIONS`, `set_precision`):
- `fp32`: everything in FP32 (the default);
- `fp16-mixed`: the decoder's convolutions (nearly all of its arithmetic) with FP16 weights, each one's input
  rounded to FP16 for it and its output returned in FP32; activations (SnakeBeta), norms, the transformer, the
  residual additions, the streaming state and the output stay FP32. For devices without TF32 (compute
  capability < 8.0: a T4 runs FP32 at an eighth of its FP16 tensor-core rate), where its agreement with FP32
  has been checked (`breeze-worker precision-check --codec`: SNR against FP32).
The encoder (reference audio) always runs in FP32. Any other dtype asked of `to` is ignored (and logged);
inputs of any float dtype are converted.

The reference encoder (transformers' Mimi, only for requests that clone a voice) may be given as a loader
instead of a module (`load_codec` does): it is built, and transformers imported, on first use or when
`load_encoder` is called (the worker's start-up does so after it begins serving); callers that encode
meanwhile wait for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from breeze_worker.model.codec.config import CodecConfig
from breeze_worker.model.codec.decoder import CodecDecoder
from breeze_worker.model.codec.layers import TwoFormConvolution
from breeze_worker.model.codec.streaming import DecoderStreamState

if TYPE_CHECKING:
    from breeze_worker.model.codec.encoder import ReferenceEncoder

log = logging.getLogger(__name__)

CODEC_PRECISIONS = ("fp32", "fp16-mixed")


def require_fp32(dtype: torch.dtype | None, what: str = "codec") -> None:
    """Log (once per call site) that a non-FP32 dtype request is ignored: the codec stays in FP32."""
    if dtype is not None and dtype != torch.float32:
        log.info("the %s runs in float32; ignoring the requested dtype %s", what, dtype)


class Codec:
    """Qwen3-TTS-Tokenizer-12Hz: 16 codebooks per frame, 1920 samples per frame, 24 kHz mono."""

    def __init__(self, config: CodecConfig, decoder: CodecDecoder,
                 encoder: ReferenceEncoder | Callable[[torch.device], ReferenceEncoder]):
        """`encoder`: the module, or a loader `f(device) -> module` called on first use (`load_encoder`)."""
        self.config = config
        self.decoder = decoder.to(torch.float32).eval()
        self._encoder: ReferenceEncoder | None = None
        self._encoder_loader: Callable[[torch.device], ReferenceEncoder] | None = None
        self._encoder_lock = threading.Lock()
        if isinstance(encoder, torch.nn.Module):
            self._encoder = cast("ReferenceEncoder", encoder.to(torch.float32).eval())
        else:
            self._encoder_loader = encoder
        self.precision = "fp32"

    @property
    def encoder(self) -> ReferenceEncoder:
        """The reference encoder, loaded now if it was not yet (`load_encoder`)."""
        encoder = self._encoder
        return encoder if encoder is not None else self.load_encoder()

    @property
    def encoder_loaded(self) -> bool:
        return self._encoder is not None

    def load_encoder(self) -> ReferenceEncoder:
        """Build the reference encoder from its loader on the decoder's device (once; concurrent callers wait)."""
        with self._encoder_lock:
            if self._encoder is None:
                assert self._encoder_loader is not None  # a codec holds one or the other
                self._encoder = self._encoder_loader(self.device).to(torch.float32).eval()
                self._encoder_loader = None
            return self._encoder

    def set_precision(self, name: str) -> list[str]:
        """Run the decoder in `name` (module docstring); returns the convolutions whose weights are FP16 now.
        One way: rounding the weights to FP16 loses their FP32 values, so fp16-mixed cannot go back to fp32 (a
        comparison decodes with a copy: measure/codec_precision.py)."""
        if name not in CODEC_PRECISIONS:
            raise ValueError(f"codec precision must be one of {', '.join(CODEC_PRECISIONS)}, not {name!r}")
        if self.precision != "fp32" and name != self.precision:
            raise ValueError(f"the codec's weights were rounded for {self.precision}: load it again for {name}")
        self.precision = name
        dtype = torch.float16 if name == "fp16-mixed" else torch.float32
        halves = []
        for module_name, module in self.decoder.named_modules():
            if isinstance(module, TwoFormConvolution):
                module.conv.to(dtype)
                if dtype == torch.float16:
                    halves.append(module_name)
        return halves

    @property
    def sample_rate(self) -> int:
        return self.config.output_sample_rate

    @property
    def samples_per_frame(self) -> int:
        return self.config.decode_upsample_rate

    @property
    def num_codebooks(self) -> int:
        return self.config.decoder.num_quantizers

    @property
    def codebook_size(self) -> int:
        return self.config.decoder.codebook_size

    @property
    def device(self) -> torch.device:
        return self.decoder.device

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> Codec:
        """Move to `device`; the dtype stays float32 (see the module docstring), in the codec's precision."""
        require_fp32(dtype)
        self.decoder.to(device=device, dtype=torch.float32)
        if self._encoder is not None:  # a loader builds it on the decoder's device when it is needed
            self._encoder.to(device=device, dtype=torch.float32)
            self._encoder.after_load()
        self.set_precision(self.precision)
        return self

    def decode(self, codes: torch.Tensor | np.ndarray) -> torch.Tensor:
        """codes [B, 16, T] -> float32 [B, T * 1920] on the codec's device (every row from silence)."""
        codes = torch.as_tensor(codes)
        if codes.dim() != 3 or codes.shape[1] != self.num_codebooks:
            raise ValueError(f"codes must be [batch, {self.num_codebooks}, frames], got {tuple(codes.shape)}")
        if codes.dtype.is_floating_point:
            raise ValueError(f"codes must be integers, got {codes.dtype}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.codebook_size}), got {int(codes.min())}..{int(codes.max())}")
        return self.decoder.decode(codes)

    def new_stream(self, batch: int = 1) -> DecoderStreamState:
        return self.decoder.new_stream(batch)

    def decode_stream(self, codes: torch.Tensor, state: DecoderStreamState) -> torch.Tensor:
        """Next frames of each stream: codes [B, 16, n] -> float32 [B, n * 1920]; no host sync."""
        return self.decoder.decode_stream(codes, state)

    def encode(self, wav24k: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Mono 24 kHz waveform [N] (any float dtype) -> codes int64 [ceil(N / 1920), 16] on the CPU."""
        return self.encoder.encode(wav24k)
