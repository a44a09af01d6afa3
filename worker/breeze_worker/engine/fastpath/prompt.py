"""The text encoder in CUDA graphs, captured at start-up for every batch of segments a join can bring.

A join's text segments (one to four per request, `MAX_TEXT_SEGMENTS`, from every joiner of a frame boundary)
run through the 26-layer encoder as one batch. Run eagerly that is ~1,000 launches, and the host issuing
them holds every running stream's next step back; a graph replays them as one.

Shapes: each segment is right-padded to its own length bucket (`TEXT_BUCKETS`; `plan`) and each bucket's
count to a power of two (rows of one masked pad token fill the batch; rows never mix in the encoder, and
padded keys are masked in every layer, so a real token's state is the unpadded computation's up to GEMM
rounding on the GPU). A bucket's batch larger than `MAX_TOKENS` (rows x length) runs as several replays.
`prepare` captures every (rows, length) key a worker of `max_streams` streams can reach, so serving never
captures; a key not captured (a caller that skipped `prepare`) is captured on its first use, and says so. A
worker that starts serving before everything is built prepares the keys of one stream's join first and the
rest from its start-up thread (`prepare(..., background=True)`) while joins replay the keys already there:
each capture records on a stream of its own in thread-local mode (fastpath/graph.py `capture_graph`), on
inputs and outputs of its own, so it touches nothing a replay uses. Segments
longer than the last bucket, the CPU, and any capture failure use the model's own `encode_segments` (or,
for the CPU tests of the bucketing, `use_graphs=False`: the same padded batches run eagerly). One instance
per model (`text_encoder_graphs`); replays are serialized by a lock and their outputs copied out.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import torch

from breeze_worker.engine.fastpath.fused import _next_power_of_two
from breeze_worker.engine.fastpath.graph import capture_graph

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

    _Captured = tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]  # graph, ids, mask, output

log = logging.getLogger(__name__)

TEXT_BUCKETS = (32, 64, 128, 256, 512)
MAX_TOKENS = 4096  # rows x padded length of one graph (its activations); larger batches replay several
# text segments of one request: reference transcript + text, twice with CFG; with two guidance scales the
# instruction prompt, the clone prompt's two and the plain prompt (model/prompts.py)
MAX_TEXT_SEGMENTS = 4


def plan(lengths: list[int], max_tokens: int = MAX_TOKENS) -> list[tuple[int, list[int], int]] | None:
    """How a batch of segments of these token lengths runs: chunks of (length bucket, segment indices, row
    bucket). Each segment goes to its own length bucket (one long segment does not pad every short one of
    the join to its length: the encoder's cost grows with rows x length, and its attention with length
    squared); each bucket's segments, in their order, are split into chunks within `max_tokens`. Buckets
    run shortest first. None when a segment fits no bucket or there are none."""
    if not lengths or max(lengths) > TEXT_BUCKETS[-1]:
        return None
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(next(b for b in TEXT_BUCKETS if n <= b), []).append(i)
    chunks = []
    for length in sorted(groups):
        members = groups[length]
        per_chunk = max(1, 1 << ((max_tokens // length).bit_length() - 1))  # a power of two
        for start in range(0, len(members), per_chunk):
            part = members[start:start + per_chunk]
            chunks.append((length, part, _next_power_of_two(len(part))))
    return chunks


def keys_for(max_segments: int, max_tokens: int = MAX_TOKENS) -> list[tuple[int, int]]:
    """Every (rows, length) key `plan` gives for up to `max_segments` segments of one join."""
    keys = []
    for length in TEXT_BUCKETS:
        rows = 1
        while rows <= _next_power_of_two(max_segments) and (rows * length <= max_tokens or rows == 1):
            keys.append((rows, length))
            rows *= 2
    return keys


class TextEncoderGraphs:
    def __init__(self, lm, device: torch.device, use_graphs: bool | None = None, max_tokens: int = MAX_TOKENS):
        """`use_graphs` (default: on CUDA) False runs the same padded batches eagerly (the CPU tests)."""
        self.lm, self.device = lm, torch.device(device)
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.bucketed = use_graphs is not None or self.use_graphs  # the CPU's default: the model's own encoder
        self.max_tokens = max_tokens
        self.pad_id = int(lm.config.text_encoder.pad_token_id)
        self.graphs: dict[tuple[int, int], _Captured] = {}
        self.failed: set[tuple[int, int]] = set()
        self.lock = threading.Lock()  # replays (their static inputs and outputs), and the tables above
        self._capturing = threading.Lock()  # one capture at a time (its stream, the pool)
        self.pool: _POOL_HANDLE | None = None
        self._stream: torch.cuda.Stream | None = None
        self.prepare_s = 0.0
        self.first_use_captures = 0  # keys a join had to capture (prepare had not reached them)

    def encode_segments(self, segments: list[torch.Tensor]) -> list[torch.Tensor]:
        """Same contract as `BreezeLM.encode_segments`: [len_i, hidden] per 1-D token segment."""
        flat, starts = self.encode_flat(segments)
        return [flat[start:start + int(seg.numel())] for start, seg in zip(starts, segments)]

    def encode_flat(self, segments: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        """All segments' states in one tensor [N, hidden] (padding rows included) and the row of each
        segment's first token: segment i is rows starts[i] .. starts[i] + len_i."""
        lengths = [int(s.numel()) for s in segments]
        if not segments:
            weight = self.lm.text_encoder_proj.weight
            return weight.new_zeros((0, weight.shape[0])), []
        chunks = plan(lengths, self.max_tokens) if self.bucketed else None
        if chunks is None:  # the model's own padding: every segment to the longest, one batch
            states = self.lm.encode_padded(segments)
            return states.reshape(-1, states.shape[-1]), [i * states.shape[1] for i in range(len(segments))]
        parts: list[torch.Tensor] = []
        starts = [0] * len(segments)
        offset = 0
        for length, members, rows in chunks:
            states = self._run([segments[i] for i in members], rows, length)
            parts.append(states.reshape(-1, states.shape[-1]))
            for k, i in enumerate(members):
                starts[i] = offset + k * length
            offset += parts[-1].shape[0]
        return (torch.cat(parts) if len(parts) > 1 else parts[0]), starts

    def _batch(self, segments: list[torch.Tensor], rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """ids and mask [rows, length] on the host (pinned for CUDA); filler rows hold one masked-in pad token
        so that no row's attention is empty."""
        pin = self.device.type == "cuda"
        ids = torch.full((rows, length), self.pad_id, dtype=torch.int64, pin_memory=pin)
        mask = torch.zeros((rows, length), dtype=torch.int64, pin_memory=pin)
        for row, seg in enumerate(segments):
            ids[row, : seg.numel()] = seg.to(torch.int64).cpu()
            mask[row, : seg.numel()] = 1
        mask[len(segments):, 0] = 1
        return ids, mask

    def _run(self, segments: list[torch.Tensor], rows: int, length: int) -> torch.Tensor:
        """The encoder's states [len(segments), length, hidden] of one padded batch (a copy)."""
        ids, mask = self._batch(segments, rows, length)
        key = (rows, length)
        if not self.use_graphs or key in self.failed:
            return self.lm.encode_text(ids.to(self.device), mask.to(self.device))[: len(segments)]
        entry = self.graphs.get(key)
        if entry is None:
            self.first_use_captures += 1
            log.info("the text encoder's batch shape %d x %d was not captured yet: captured now, while its join "
                     "waits", *key)
            entry = self._capture(key)
        if entry is None:
            return self.lm.encode_text(ids.to(self.device), mask.to(self.device))[: len(segments)]
        with self.lock:
            graph, s_ids, s_mask, s_out = entry
            s_ids.copy_(ids, non_blocking=True)  # pinned: queued, no wait for the device's queue to drain
            s_mask.copy_(mask, non_blocking=True)
            graph.replay()
            return s_out[: len(segments)].clone()  # the next replay rewrites s_out

    def prepare(self, max_segments: int, background: bool = False) -> float:
        """Capture every key a join of up to `max_segments` segments can reach (CUDA graphs only); seconds.
        `background`: joins are replaying meanwhile (the log line says so; the capture is the same)."""
        if not self.use_graphs:
            return 0.0
        t0 = time.perf_counter()
        todo = [k for k in keys_for(max_segments, self.max_tokens) if k not in self.graphs and k not in self.failed]
        for key in todo:
            self._capture(key)
        took = time.perf_counter() - t0
        self.prepare_s += took
        if todo:
            log.info("captured the text encoder for %d batch shapes (up to %d segments) in %.2f s%s", len(todo),
                     max_segments, took, " while serving" if background else "")
        return took

    @property
    def ready_segments(self) -> int:
        """Segments of the largest join every key of which is captured (0: none)."""
        n = 0
        while all(k in self.graphs for k in keys_for(n + 1, self.max_tokens)) and n < 4096:
            n += 1
        return n

    def _capture(self, key: tuple[int, int]) -> _Captured | None:
        """Capture one key: a warm-up run on the capture's own stream, then the capture (`capture_graph`)."""
        with self._capturing:
            if key in self.graphs:  # captured by another thread meanwhile
                return self.graphs[key]
            try:
                rows, length = key
                ids, mask = self._batch([], rows, length)
                if self._stream is None:
                    self._stream = torch.cuda.Stream(self.device)
                stream = self._stream
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):  # the inputs and a warm-up outside the capture
                    s_ids = ids.to(self.device, non_blocking=True)
                    s_mask = mask.to(self.device, non_blocking=True)
                    self.lm.encode_text(s_ids, s_mask)
                stream.synchronize()
                if self.pool is None:
                    self.pool = torch.cuda.graph_pool_handle()
                graph, s_out = capture_graph(lambda: self.lm.encode_text(s_ids, s_mask), stream, self.pool)
                stream.synchronize()
                entry = (graph, s_ids, s_mask, s_out)
                with self.lock:
                    self.graphs[key] = entry
                log.debug("captured the text encoder for %d segments x %d tokens", *key)
                return entry
            except Exception as exc:  # the model's own encoder serves this shape from now on
                self.failed.add(key)
                log.warning("text encoder graph capture for %s failed (%s: %s); encoding eagerly", key,
                            type(exc).__name__, exc)
                return None


_INSTANCES: dict[tuple[int, str], TextEncoderGraphs] = {}
_LOCK = threading.Lock()


def text_encoder_graphs(lm, device: torch.device) -> TextEncoderGraphs:
    key = (id(lm), str(device))
    with _LOCK:
        if key not in _INSTANCES or _INSTANCES[key].lm is not lm:  # an id reused by a later model
            _INSTANCES[key] = TextEncoderGraphs(lm, device)
        return _INSTANCES[key]


def clear_text_encoder_graphs() -> None:
    with _LOCK:
        _INSTANCES.clear()
