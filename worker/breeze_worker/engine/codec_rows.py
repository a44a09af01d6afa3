"""The codec side of a step: every active stream's streaming state as one slot of one batch.

Streams join and leave at frame boundaries; each step decodes all active streams' new frames in ONE
batched codec call and ONE host read, so the codec's cost per step barely grows with the number of
streams (an unbatched codec is what made a peer's first-byte time grow 12x under load).

The batch has a fixed number of slots (a bucket: 1, 2, 4, ...; engine/codec_graphs.py) so that on CUDA
the step replays a CUDA graph: a joining stream takes the lowest free slot, zero-filled in place (it
starts from silence); a leaving stream frees its slot. A stream that finds no free slot moves every row
to the next bucket; when the occupied slots fit in a quarter of the bucket they move to the smaller one
(not at half, so one stream joining and leaving at a boundary does not switch buckets every step).
Every step decodes all slots; idle ones decode junk that nobody reads. On the CPU the same slots run
eagerly.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from breeze_worker.engine.codec_graphs import SlotBatch, bucket_for, pool_for


def _give_back(pool, held: list) -> None:
    if held[0] is not None:
        pool.release(held[0])
        held[0] = None


class CodecRows:
    def __init__(self, codec):
        self.codec = codec
        self._pool = pool_for(codec)
        self._slots: dict[object, int] = {}  # key -> slot, in join order
        self._held: list[SlotBatch | None] = [None]  # a list, so the finalizer can return it without `self`
        weakref.finalize(self, _give_back, self._pool, self._held)  # a dropped CodecRows frees its batch

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def keys(self) -> list:
        return list(self._slots)

    @property
    def capacity(self) -> int:
        """Slots in the current batch (0 when no stream is active)."""
        return self._held[0].rows if self._held[0] is not None else 0

    @property
    def graphed(self) -> bool:
        return self._held[0] is not None and self._held[0].graphed

    def slot_of(self, key) -> int:
        return self._slots[key]

    def prepare(self, max_streams: int) -> float:
        """Capture the graphs of every bucket up to `max_streams` now (e.g. at warm-up); seconds taken."""
        return self._pool.prepare(max_streams)

    def add(self, key) -> None:
        """A new stream starts from silence in the lowest free slot."""
        if key in self._slots:
            raise ValueError(f"stream {key!r} is already in the codec batch")
        used = set(self._slots.values())
        slot = next(i for i in range(len(used) + 1) if i not in used)
        if slot >= self.capacity:
            self._move_to(bucket_for(slot + 1))
        with torch.inference_mode():
            self._held[0].state.zero_rows_(slot)
        self._slots[key] = slot

    def remove(self, key) -> None:
        if self._slots.pop(key, None) is None:
            return
        if not self._slots:
            _give_back(self._pool, self._held)
            return
        needed = max(self._slots.values()) + 1
        if needed <= self.capacity // 4:
            self._move_to(bucket_for(needed))

    def _move_to(self, rows: int) -> None:
        """Continue in a batch of `rows` slots: every slot below both sizes is copied, slot numbers kept."""
        new, old = self._pool.acquire(rows), self._held[0]
        if old is not None:
            with torch.inference_mode():
                new.state.copy_(old.state, slice(0, min(old.rows, rows)))
            self._pool.release(old)
        self._held[0] = new

    def decode(self, frames: dict) -> dict:
        """{key: int64 [16] frame} for EVERY active stream -> {key: float32 samples [1920]}: one batched
        call (a graph replay on CUDA) and one host read."""
        if set(frames) != set(self._slots):
            raise RuntimeError("the codec batch must get exactly one frame per active stream")
        if not self._slots:
            return {}
        batch = self._held[0]
        host = batch.new_host_codes()
        for key, slot in self._slots.items():
            host[slot].copy_(torch.as_tensor(frames[key], dtype=torch.long).reshape(-1))
        audio = batch.step(host)
        samples = audio.cpu().numpy()  # the one host read of the codec step
        return {k: samples[slot].copy() for k, slot in self._slots.items()}
