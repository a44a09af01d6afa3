"""The codec side of a step: every active stream's streaming state as one row of one batch.

Streams join and leave at frame boundaries; each step decodes all active streams' new frames in ONE
batched codec call and ONE host read, so the codec's cost per step barely grows with the number of
streams (an unbatched codec is what made a peer's first-byte time grow 12x under load).
"""

from __future__ import annotations

import numpy as np
import torch


class CodecRows:
    def __init__(self, codec):
        self.codec = codec
        self.keys: list[object] = []  # one per row, in row order
        self.state = None  # DecoderStreamState with len(keys) rows, or None when empty

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, key) -> None:
        """A new stream starts from silence in a new last row."""
        with torch.inference_mode():
            fresh = self.codec.new_stream(1)
            self.state = fresh if self.state is None else self.state.concat(fresh)
        self.keys.append(key)

    def remove(self, key) -> None:
        if key not in self.keys:
            return
        index = self.keys.index(key)
        self.keys.pop(index)
        keep = [i for i in range(len(self.keys) + 1) if i != index]
        with torch.inference_mode():
            self.state = self.state.select(keep) if self.keys else None

    def decode(self, frames: dict) -> dict:
        """{key: int64 [16] frame} for EVERY row -> {key: float32 samples [1920]} (one batched call)."""
        if set(frames) != set(self.keys):
            raise RuntimeError("the codec batch must get exactly one frame per active stream")
        if not self.keys:
            return {}
        with torch.inference_mode():
            codes = torch.stack([torch.as_tensor(frames[k], dtype=torch.long).reshape(-1) for k in self.keys])
            codes = codes.to(self.codec.device)[:, :, None]  # [B, 16, 1]
            pcm = self.codec.decode_stream(codes, self.state)
            samples = pcm.float().cpu().numpy()  # the one host read of the codec step
        return {k: np.ascontiguousarray(samples[i]) for i, k in enumerate(self.keys)}
