"""The text encoder in CUDA graphs, one per (segments, padded length) bucket: the first frame should not
wait on ~1,000 eager launches of the 26-layer encoder.

Segments are right-padded to a length bucket (`TEXT_BUCKETS`); padding keys are masked in every layer,
so the real tokens' states are the unpadded computation's (up to GEMM rounding on the GPU). A bucket's
graph is captured on its first use (that request runs the encoder eagerly once first); longer segments,
the CPU, and any capture failure use the model's own `encode_segments`. One instance per model
(`text_encoder_graphs`); replays are serialized by a lock and their outputs copied out.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

    _Captured = tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]  # graph, ids, mask, output

log = logging.getLogger(__name__)

TEXT_BUCKETS = (32, 64, 128, 256, 512)


class TextEncoderGraphs:
    def __init__(self, lm, device: torch.device):
        self.lm, self.device = lm, device
        self.graphs: dict[tuple[int, int], _Captured] = {}
        self.failed: set[tuple[int, int]] = set()
        self.lock = threading.Lock()
        self.pool: _POOL_HANDLE | None = None

    def encode_segments(self, segments: list[torch.Tensor]) -> list[torch.Tensor]:
        """Same contract as `BreezeLM.encode_segments`: [len_i, hidden] per 1-D token segment."""
        if not segments or self.device.type != "cuda":
            return self.lm.encode_segments(segments)
        longest = max(int(s.numel()) for s in segments)
        bucket = next((b for b in TEXT_BUCKETS if longest <= b), None)
        if bucket is None:
            return self.lm.encode_segments(segments)
        key = (len(segments), bucket)
        if key in self.failed:
            return self.lm.encode_segments(segments)
        ids = torch.full((len(segments), bucket), self.lm.config.text_encoder.pad_token_id, dtype=torch.int64)
        mask = torch.zeros((len(segments), bucket), dtype=torch.int64)
        for row, seg in enumerate(segments):
            ids[row, : seg.numel()] = seg.to(torch.int64).cpu()
            mask[row, : seg.numel()] = 1
        with self.lock:
            entry = self.graphs.get(key) or self._capture(key, ids, mask)
            if entry is None:
                return self.lm.encode_segments(segments)
            graph, s_ids, s_mask, s_out = entry
            s_ids.copy_(ids, non_blocking=False)
            s_mask.copy_(mask, non_blocking=False)
            graph.replay()
            return [s_out[row, : seg.numel()].clone() for row, seg in enumerate(segments)]

    def _capture(self, key: tuple[int, int], ids: torch.Tensor, mask: torch.Tensor) -> _Captured | None:
        try:
            s_ids, s_mask = ids.to(self.device), mask.to(self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up outside the capture
                self.lm.encode_text(s_ids, s_mask)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                s_out = self.lm.encode_text(s_ids, s_mask)
            self.graphs[key] = (graph, s_ids, s_mask, s_out)
            log.info("captured the text encoder for %d segments x %d tokens", *key)
            return self.graphs[key]
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
        if key not in _INSTANCES:
            _INSTANCES[key] = TextEncoderGraphs(lm, device)
        return _INSTANCES[key]


def clear_text_encoder_graphs() -> None:
    with _LOCK:
        _INSTANCES.clear()
