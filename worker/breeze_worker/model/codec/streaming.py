"""Per-request streaming state of the codec decoder.

Decoding frame by frame gives the same audio as decoding all frames at once because every part of the
decoder is causal: each causal convolution keeps the last `(kernel - 1) * dilation` input samples as left
context, each transposed convolution keeps its last `ceil(kernel / stride) - 1` input steps (whose output
overlaps the next step's), and the transformer keeps the keys and values of the last `window - 1` frames.

Batching: row `b` of every tensor here belongs to one request. The engine keeps one state for all the
requests it decodes together and reshapes it between calls:
  - `decoder.new_stream(n)`: fresh state for `n` new requests;
  - `state.select(rows)`: keep (and reorder) rows, e.g. drop finished requests;
  - `DecoderStreamState.concat([a, b])` / `a.concat(b)`: add rows, e.g. newly admitted requests;
  - `state.reset(rows)`: restart rows (a slot reused by a new request).
For a state whose tensors must keep their addresses (the inputs of a CUDA graph, engine/codec_graphs.py,
which decodes into a new state over the same tensors: `decode_stream` replaces a state's tensors and never
writes into them):
  - `state.copy_(other, rows)`: write `other`'s values into this state's tensors;
  - `state.zero_rows_(rows)`: restart rows by zero-filling them.
The decoder's `decode_stream(codes [B, 16, n], state)` then decodes `n` frames for every row at once. No
method here synchronizes with the device (no `.item()`), so it is safe to use between graph replays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ContextSpec:
    """Left context one causal (transposed) convolution keeps: `channels` x `steps`."""

    channels: int
    steps: int


@dataclass(frozen=True)
class AttentionSpec:
    """Key/value cache of one transformer layer: the last `slots` frames of `kv_heads` x `head_dim`."""

    kv_heads: int
    head_dim: int
    slots: int  # sliding_window - 1


class DecoderStreamState:
    """Streaming state of a batch of requests (row = request). See the module docstring."""

    def __init__(
        self,
        contexts: list[torch.Tensor],
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        position: torch.Tensor,
    ) -> None:
        self.contexts = contexts  # [B, channels, steps] per causal conv, in decoder order
        self.keys = keys  # [B, kv_heads, slots, head_dim] per transformer layer (after RoPE)
        self.values = values
        self.position = position  # [B] int64: frames decoded so far = RoPE position of the next frame

    @classmethod
    def zeros(
        cls,
        batch: int,
        contexts: Sequence[ContextSpec],
        attention: Sequence[AttentionSpec],
        device: torch.device | str = "cpu",
    ) -> DecoderStreamState:
        f32 = torch.float32
        return cls(
            contexts=[torch.zeros(batch, c.channels, c.steps, dtype=f32, device=device) for c in contexts],
            keys=[torch.zeros(batch, a.kv_heads, a.slots, a.head_dim, dtype=f32, device=device) for a in attention],
            values=[torch.zeros(batch, a.kv_heads, a.slots, a.head_dim, dtype=f32, device=device) for a in attention],
            position=torch.zeros(batch, dtype=torch.int64, device=device),
        )

    @property
    def batch_size(self) -> int:
        return int(self.position.shape[0])

    @property
    def device(self) -> torch.device:
        return self.position.device

    def _tensors(self) -> list[torch.Tensor]:
        return [*self.contexts, *self.keys, *self.values, self.position]

    def _rebuild(self, tensors: list[torch.Tensor]) -> DecoderStreamState:
        n_ctx, n_kv = len(self.contexts), len(self.keys)
        return DecoderStreamState(
            contexts=tensors[:n_ctx],
            keys=tensors[n_ctx : n_ctx + n_kv],
            values=tensors[n_ctx + n_kv : n_ctx + 2 * n_kv],
            position=tensors[-1],
        )

    def select(self, rows: Sequence[int] | torch.Tensor) -> DecoderStreamState:
        """A new state holding `rows` of this one, in that order (copies; this state is unchanged)."""
        index = torch.as_tensor(rows, dtype=torch.int64, device=self.device)
        return self._rebuild([t.index_select(0, index) for t in self._tensors()])

    def concat(self, other: DecoderStreamState) -> DecoderStreamState:
        """A new state with this state's rows followed by `other`'s."""
        return DecoderStreamState.concat_all([self, other])

    @staticmethod
    def concat_all(states: Sequence[DecoderStreamState]) -> DecoderStreamState:
        """Rows of every state in order; all must come from the same decoder."""
        if not states:
            raise ValueError("concat_all needs at least one state")
        columns = zip(*(s._tensors() for s in states))
        return states[0]._rebuild([torch.cat(list(parts), dim=0) for parts in columns])

    def reset(self, rows: Sequence[int] | torch.Tensor) -> None:
        """Restart `rows` (a list of indices or a boolean mask [B]) as if freshly created.

        The tensors are replaced, not written in place, so a state filled under `torch.inference_mode`
        can be reset outside it.
        """
        rows = torch.as_tensor(rows, device=self.device)
        if rows.dtype != torch.bool:
            rows = torch.zeros(self.batch_size, dtype=torch.bool, device=self.device).index_fill(
                0, rows.to(torch.int64), True
            )

        def cleared(t: torch.Tensor) -> torch.Tensor:
            zero = torch.zeros((), dtype=t.dtype, device=t.device)
            return torch.where(rows.view(-1, *([1] * (t.dim() - 1))), zero, t)

        self.contexts = [cleared(t) for t in self.contexts]
        self.keys = [cleared(t) for t in self.keys]
        self.values = [cleared(t) for t in self.values]
        self.position = cleared(self.position)

    def copy_(self, other: DecoderStreamState, rows: slice = slice(None)) -> None:
        """Write `rows` of `other` into the same rows of this state's tensors, in place."""
        for mine, theirs in zip(self._tensors(), other._tensors(), strict=True):
            mine[rows].copy_(theirs[rows])

    def zero_rows_(self, rows: int | slice) -> None:
        """Restart `rows` in place (same values as `reset`, same tensors: safe between graph replays)."""
        torch._foreach_zero_([t[rows] for t in (*self.contexts, *self.keys, *self.values)])  # one dtype: fused
        self.position[rows].zero_()

    def advance(self, frames: int) -> None:
        self.position = self.position + frames

    def clone(self) -> DecoderStreamState:
        return self._rebuild([t.clone() for t in self._tensors()])


def slide_context(context: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prepend the kept left context to `x` [B, C, n]; return (input with context, the next context)."""
    steps = context.shape[-1]
    joined = torch.cat([context, x], dim=-1)
    return joined, joined[..., joined.shape[-1] - steps :]


def window_mask(position: torch.Tensor, frames: int, slots: int, window: int) -> torch.Tensor:
    """Boolean mask [B, 1, frames, slots + frames] of which keys each new frame may attend to.

    Keys are laid out as the cache (`slots` most recent frames before this call, oldest first) followed by
    the `frames` new ones. A row that has decoded only `position` frames has `slots - position` empty
    cache slots at the front, which are masked. Query j sees keys at distance 0 .. window - 1 behind it.
    """
    device = position.device
    query = torch.arange(frames, device=device).view(1, frames, 1)
    key = torch.arange(slots + frames, device=device).view(1, 1, slots + frames)
    # absolute positions relative to the row's first new frame: cache slot m is m - slots
    distance = (query + slots) - key  # how far behind the query the key is
    causal = (distance >= 0) & (distance < window)
    filled = torch.clamp(position, max=slots).view(-1, 1, 1)
    written = key >= (slots - filled)  # empty cache slots of young rows are masked
    return (causal & written).unsqueeze(1)
