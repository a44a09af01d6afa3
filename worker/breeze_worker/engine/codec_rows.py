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

Overlap (`launch` / `PendingAudio.wait`): on CUDA every codec operation runs on the codec's own CUDA
stream, so a launched step decodes while the engine queues and runs the next language-model step on the
default stream; its inputs come from the host, so it waits for nothing there. `launch` returns at once
(codes uploaded, graph replayed, both queued); `wait` queues the audio's copy to pinned host memory on
the caller's stream behind the codec step (an event), then blocks for that copy. The copy is not on the
codec's stream: there, the host stalled for seconds at a time waiting on the copy's event while both
streams' work was done (a device-to-host copy on a second stream beside back-to-back graph replays); on
the caller's stream such stalls are rarer, not gone, so overlap stays off by default. `decode` is both in one call.
`CodecRows(overlap=False)` keeps the codec on the caller's stream (the engine's default; the
`codec_overlap` setting asks for overlap).
"""

from __future__ import annotations

import contextlib
import time
import weakref

import numpy as np
import torch

from breeze_worker.engine.codec_graphs import SlotBatch, bucket_for, pool_for


def stack_frames(frames) -> torch.Tensor:
    """int64 [n, 16] from n frames in order. The stepper's frames are rows of one host tensor of codes, which
    stack as they are (torch.as_tensor and reshape cost ~4 us a frame on the host, ~0.3 ms a step at 64
    streams on a small CPU, on the engine thread); anything else (a list, an array) is converted first."""
    items = list(frames)
    if all(isinstance(f, torch.Tensor) and f.dim() == 1 and f.dtype == torch.long for f in items):
        return torch.stack(items)
    return torch.stack([torch.as_tensor(f, dtype=torch.long).reshape(-1) for f in items])


def _give_back(pool, held: list, stream: torch.cuda.Stream | None) -> None:
    if held[0] is not None:
        _release(pool, held[0], stream)
        held[0] = None


def _release(pool, batch: SlotBatch, stream: torch.cuda.Stream | None) -> None:
    """Back to the pool with no work of ours still queued on it: its next user may be on another stream."""
    if stream is not None:
        stream.synchronize()
    pool.release(batch)


class PendingAudio:
    """A launched codec step. `wait()` -> {key: float32 samples [1920]}: the step's one host read."""

    def __init__(self, slots: dict, audio: torch.Tensor, finished: torch.cuda.Event | None, keep: tuple = (),
                 started: torch.cuda.Event | None = None, host_ms: float | None = None, on_device: bool = False):
        self._slots = slots  # key -> slot at launch time
        # [rows, 1920]: the CPU result, host memory a queued copy fills, or (`on_device`) the graph's output,
        # copied at `wait`
        self._audio: torch.Tensor | None = audio  # None once read
        self._finished = finished  # recorded after the step (and its copy, unless `on_device`) on its stream
        self._on_device = on_device
        self._keep: tuple | None = keep  # host buffers the queued copies read, alive until the wait
        self._started = started  # timing event before the step (CUDA, `launch(timed=True)`)
        self._host_ms = host_ms  # the CPU's step time (computed in `launch`)
        self._result: np.ndarray | None = None

    def device_ms(self) -> float | None:
        """The step's own time after `wait()`: between events on the codec's stream (CUDA, timed), or the
        CPU's compute time."""
        if self._started is not None and self._finished is not None and self._result is not None:
            return self._started.elapsed_time(self._finished)
        return self._host_ms

    @property
    def keys(self) -> list:
        return list(self._slots)

    @property
    def queued_on_device(self) -> bool:
        """True for a CUDA step (queued on a stream, after whatever was queued there before it)."""
        return self._finished is not None

    def wait(self) -> dict:
        """{key: float32 samples [1920]} (rows of `wait_rows`' array)."""
        rows, slots = self.wait_rows()
        return {k: rows[slot] for k, slot in slots.items()}

    def wait_rows(self) -> tuple[np.ndarray, dict]:
        """The step's audio as one host array [rows, 1920] (its own copy) and {key: row}: a caller handling
        every stream of the step (the scheduler encodes all of them at once) reads it without a per-key copy."""
        if self._result is None:
            audio = self._audio
            assert audio is not None  # dropped only once the result is in
            done = self._finished
            if self._on_device:  # the copy on the caller's stream, after the codec's step
                assert done is not None  # a step queued on the device always records its event
                stream = torch.cuda.current_stream(audio.device)
                stream.wait_event(done)
                host = torch.empty(audio.shape, dtype=audio.dtype, pin_memory=True)
                host.copy_(audio, non_blocking=True)
                done = torch.cuda.Event()
                done.record(stream)
                self._audio = audio = host
            if done is not None:
                done.synchronize()
            self._result = audio.numpy().copy()
            self._audio = self._keep = None
        return self._result, self._slots


class CodecRows:
    def __init__(self, codec, overlap: bool = False):
        """`overlap`: run on a CUDA stream of its own (no effect on the CPU; off, as in the engine, unless
        asked)."""
        self.codec = codec
        self._pool = pool_for(codec)
        device = self._pool.device
        self.stream = torch.cuda.Stream(device) if overlap and device.type == "cuda" else None
        self._slots: dict[object, int] = {}  # key -> slot, in join order
        self._held: list[SlotBatch | None] = [None]  # a list, so the finalizer can return it without `self`
        weakref.finalize(self, _give_back, self._pool, self._held, self.stream)  # a dropped CodecRows frees it

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

    def _on_stream(self):
        """Every device operation on the slot states runs here, in the order the host issues them."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

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
        batch = self._held[0]
        assert batch is not None  # capacity > slot: a batch is held
        with torch.inference_mode(), self._on_stream():
            batch.state.zero_rows_(slot)
        self._slots[key] = slot

    def add_all(self, keys) -> None:
        """Several streams joining at one boundary: the slots `add` would give them one by one, but the batch
        moves at most once, straight to the bucket that holds them all (not through every bucket between: a
        bucket not built yet is compiled and captured on first use, 16-35 s each when the codec is compiled)."""
        keys = list(keys)
        used = set(self._slots.values())
        free = (i for i in range(len(used) + len(keys)) if i not in used)
        top = max([*used, *(next(free) for _ in keys)], default=-1) + 1
        if top > self.capacity:
            self._move_to(bucket_for(top))
        for key in keys:
            self.add(key)

    def remove(self, key) -> None:
        self.remove_all([key])

    def remove_all(self, keys) -> None:
        """Streams leaving at one boundary: the batch shrinks at most once, after all of them have left (a
        burst whose streams end together gives its batch back without passing through smaller buckets)."""
        if not [key for key in keys if self._slots.pop(key, None) is not None]:
            return
        if not self._slots:
            _give_back(self._pool, self._held, self.stream)
            return
        needed = max(self._slots.values()) + 1
        if needed <= self.capacity // 4:
            self._move_to(bucket_for(needed))

    def _move_to(self, rows: int) -> None:
        """Continue in a batch of `rows` slots: every slot below both sizes is copied, slot numbers kept."""
        new, old = self._pool.acquire(rows), self._held[0]
        if old is not None:
            with torch.inference_mode(), self._on_stream():
                new.state.copy_(old.state, slice(0, min(old.rows, rows)))
            _release(self._pool, old, self.stream)
        self._held[0] = new

    def launch(self, frames: dict, timed: bool = False) -> PendingAudio:
        """{key: int64 [16] frame} for EVERY active stream -> the queued step (one batched call, a graph
        replay on CUDA); `.wait()` gives {key: float32 samples [1920]}. The next `launch` may follow the
        wait only (the graph's output is rewritten by each replay). `timed`: record CUDA timing events
        around the step (`PendingAudio.device_ms`)."""
        if set(frames) != set(self._slots):
            raise RuntimeError("the codec batch must get exactly one frame per active stream")
        if not self._slots:
            return PendingAudio({}, torch.zeros(0, 0), None)
        batch = self._held[0]
        assert batch is not None  # held while any stream is active
        host = batch.new_host_codes()
        # one indexed write for all streams, not one small copy per stream
        host[torch.tensor(list(self._slots.values()))] = stack_frames(frames[k] for k in self._slots)
        if batch.device.type != "cuda":
            t0 = time.perf_counter()
            audio = batch.step(host)
            return PendingAudio(dict(self._slots), audio, None, host_ms=1000 * (time.perf_counter() - t0))
        with self._on_stream():
            started = torch.cuda.Event(enable_timing=True) if timed else None
            if started is not None:
                started.record()
            audio = batch.step(host)
            if self.stream is None:  # one stream: the copy follows at once
                audio_out = torch.empty(audio.shape, dtype=audio.dtype, pin_memory=True)
                audio_out.copy_(audio, non_blocking=True)
            else:  # copied by `wait`, on the caller's stream (module docstring)
                audio_out = audio
            finished = torch.cuda.Event(enable_timing=timed)
            finished.record()
        return PendingAudio(dict(self._slots), audio_out, finished, keep=(host,), started=started,
                            on_device=self.stream is not None)

    def decode(self, frames: dict) -> dict:
        """`launch(frames).wait()`: decode now, one host read."""
        return self.launch(frames).wait()
