"""Static, preallocated KV caches for the fast decode path.

Nothing here changes shape after allocation, so every read and write can live inside a CUDA graph.
Rows are model rows: one per stream, two for a CFG stream (cond, uncond).

`BackboneCache`: keys/values `[layers, rows, kv_heads, capacity, head_dim]`, a validity mask
`[rows, capacity]` (False on left padding and on positions not yet written) and, per row, the next slot to
write (`write_pos`) and the next RoPE position (`rope_pos`, which skips padding). A decode step writes one
slot per row at `write_pos` with a scatter (a device tensor, no host read) and attends over a prefix of
the cache whose length is a *bucket* (a Python int chosen per graph), so short prompts do not pay for the
full capacity.

`DepthCache`: keys/values `[layers, rows, kv_heads, 16, head_dim]`. The depth decoder restarts every frame
and its positions (0..15) are the same every frame, so every index into it is a Python constant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BUCKETS = (256, 512, 1024, 2048)


def bucket_for(length: int, capacity: int) -> int:
    """The smallest attention-length bucket holding `length` slots (capped at the capacity)."""
    for b in BUCKETS:
        if length <= b and b <= capacity:
            return b
    return capacity


def buckets_up_to(capacity: int) -> list[int]:
    out = [b for b in BUCKETS if b < capacity]
    return out + [capacity]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, shared_layers: bool) -> torch.Tensor:
    """Zeros of `shape` [layers, ...]; with `shared_layers`, one layer's memory seen by every layer (the first
    dimension's stride is 0), so that `t[layer]` is shaped and strided as one layer of the full tensor. A step
    built so (FrameStep's `shared_layers`) runs the same compiled code as a step with caches of its own (its
    units see one layer's keys and values at a time, of the same shapes and strides) at 1/layers of the cache
    memory; what it computes is junk, the layers writing over one another (engine/batch_graphs.py compiles on
    such a step while streams use the real one)."""
    if not shared_layers:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.zeros((1, *shape[1:]), dtype=dtype, device=device).expand(shape)


@dataclass
class BackboneCache:
    key: torch.Tensor  # [layers, rows, kv_heads, capacity, head_dim]
    value: torch.Tensor
    valid: torch.Tensor  # bool [rows, capacity]
    write_pos: torch.Tensor  # int64 [rows]: slot the next token goes to
    rope_pos: torch.Tensor  # int64 [rows]: RoPE position of the next token

    @classmethod
    def allocate(cls, layers: int, rows: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device, shared_layers: bool = False) -> BackboneCache:
        """`shared_layers`: every layer's keys (and values) are the same memory (`_zeros`)."""
        shape = (layers, rows, kv_heads, capacity, head_dim)
        return cls(
            key=_zeros(shape, dtype, device, shared_layers),
            value=_zeros(shape, dtype, device, shared_layers),
            valid=torch.zeros(rows, capacity, dtype=torch.bool, device=device),
            write_pos=torch.zeros(rows, dtype=torch.int64, device=device),
            rope_pos=torch.zeros(rows, dtype=torch.int64, device=device),
        )

    @property
    def capacity(self) -> int:
        return self.key.shape[3]

    @property
    def rows(self) -> int:
        return self.key.shape[1]

    def reset(self) -> None:
        self.valid.zero_()
        self.write_pos.zero_()
        self.rope_pos.zero_()

    def fill_prompt(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Write a prompt's keys/values `[rows, kv_heads, T, head_dim]` into slots 0..T-1 (prefill)."""
        t = key.shape[2]
        self.key[layer, :, :, :t].copy_(key)
        self.value[layer, :, :, :t].copy_(value)

    def write_step(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Write one token's keys/values `[rows, kv_heads, 1, head_dim]` at each row's `write_pos`."""
        rows, heads, _, dim = key.shape
        index = self.write_pos.view(rows, 1, 1, 1).expand(rows, heads, 1, dim)
        self.key[layer].scatter_(2, index, key.to(self.key.dtype))
        self.value[layer].scatter_(2, index, value.to(self.value.dtype))

    def view(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the first `length` slots (a view, no copy)."""
        return self.key[layer, :, :, :length], self.value[layer, :, :, :length]

    def step_mask(self, length: int) -> torch.Tensor:
        """Attention mask `[rows, 1, 1, length]` for a decode step (call after `mark_written`)."""
        return self.valid[:, None, None, :length]

    def mark_written(self) -> None:
        """Mark each row's `write_pos` slot valid (before the step's attention reads it)."""
        self.valid.scatter_(1, self.write_pos[:, None], True)

    def advance(self) -> None:
        """After a step: every row moves one slot and one RoPE position on."""
        self.write_pos.add_(1)
        self.rope_pos.add_(1)


@dataclass
class DepthCache:
    key: torch.Tensor  # [layers, rows, kv_heads, 16, head_dim]
    value: torch.Tensor

    @classmethod
    def allocate(cls, layers: int, rows: int, kv_heads: int, head_dim: int, positions: int,
                 dtype: torch.dtype, device: torch.device, shared_layers: bool = False) -> DepthCache:
        shape = (layers, rows, kv_heads, positions, head_dim)
        return cls(key=_zeros(shape, dtype, device, shared_layers),
                   value=_zeros(shape, dtype, device, shared_layers))

    def write(self, layer: int, start: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Write `[rows, kv_heads, n, head_dim]` at positions start..start+n-1 (Python constants)."""
        n = key.shape[2]
        self.key[layer, :, :, start:start + n].copy_(key)
        self.value[layer, :, :, start:start + n].copy_(value)

    def view(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.key[layer, :, :, :length], self.value[layer, :, :, :length]
