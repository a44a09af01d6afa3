"""The host-sync audit of one decode path: run one request under `SyncDetector`, count syncs per frame
and name their source lines. Schema of the result: `audit_path` below (JSON `breeze-audit-syncs/1`).

A frame's syncs are those between handing out the previous frame and handing out this one (for the
eager path: its backbone step, sampling, depth steps and the host copy of the codes); syncs made while
encoding the prompt, prefilling and setting up the stream are counted as `setup`, not as frame 0's.
A warm-up request runs first, unaudited (the fast path captures its CUDA graphs there). On CUDA the run
is also counted by `torch.cuda.set_sync_debug_mode("warn")`, PyTorch's own ground truth.
"""

from __future__ import annotations

import collections
import contextlib
import warnings

import torch

from breeze_worker.engine import tracing
from breeze_worker.measure.setup import frame_source
from breeze_worker.measure.syncaudit import SyncDetector, SyncEvent

SCHEMA = "breeze-audit-syncs/1"


@contextlib.contextmanager
def _cuda_sync_debug(device: torch.device):
    """Records PyTorch's sync warnings (CUDA only); yields the list they are appended to."""
    if device.type != "cuda":
        yield None
        return
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode(previous)


def _sync_warnings(caught) -> int:
    return sum(1 for w in caught if "synchroniz" in str(w.message))


def audit_path(model, request, device: torch.device, path: str, budget: int | None = None,
               settings=None) -> dict:
    """Audit one request on `path` ("eager" or "fast"); a JSON-able dict (see the module docstring). `settings`:
    the fast path's (None: the defaults)."""
    for _ in frame_source(path, model, request, device, settings=settings):  # warm-up: first-use costs, graph capture
        pass
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    detector = SyncDetector(device)
    cuda_per_frame: list[int] = []
    frames = 0
    with tracing.Tracer().recording(), _cuda_sync_debug(device) as caught, detector:
        detector.frame = 0
        seen_warnings = 0
        for _ in frame_source(path, model, request, device, settings=settings):
            with detector.paused():
                frames += 1
                if caught is not None:
                    total = _sync_warnings(caught)
                    cuda_per_frame.append(total - seen_warnings)
                    seen_warnings = total
                detector.frame = frames
    events = detector.events
    per_frame = [0] * frames
    for e in events:
        if not e.setup and e.frame is not None and e.frame < frames:
            per_frame[e.frame] += 1
    trailing = [e for e in events if not e.setup and (e.frame is None or e.frame >= frames)]
    over = [i for i, n in enumerate(per_frame) if budget is not None and n > budget]
    return {
        "path": path, "frames": frames, "emulated_device": detector.emulated,
        "setup_syncs": sum(1 for e in events if e.setup),
        "syncs_per_frame": per_frame,
        "max_syncs_per_frame": max(per_frame, default=0),
        "mean_syncs_per_frame": (sum(per_frame) / frames) if frames else 0.0,
        "after_last_frame": len(trailing),
        "budget": budget, "frames_over_budget": over, "within_budget": not over,
        "sites": _sites(events, frames),
        "cuda_sync_debug_per_frame": cuda_per_frame if caught is not None else None,
        "events": [e.to_dict() for e in events],
    }


def _sites(events: list[SyncEvent], frames: int) -> list[dict]:
    """Distinct sync sites, most frequent per frame first."""
    groups: dict[tuple, list[SyncEvent]] = collections.defaultdict(list)
    for e in events:
        groups[(e.site, e.op, e.setup)].append(e)
    out = []
    for (site, op, setup), group in groups.items():
        first = group[0]
        out.append({"site": site, "op": op, "setup": setup, "function": first.function, "code": first.code,
                    "origin": first.origin, "count": len(group),
                    "per_frame": None if setup or not frames else len(group) / frames})
    return sorted(out, key=lambda s: (s["setup"], -s["count"], s["site"]))


def table(doc: dict) -> str:
    lines = []
    for result in doc["paths"]:
        emulated = " (CPU: device syncs emulated)" if result["emulated_device"] else ""
        if result["budget"] is not None:
            budget = f"  budget {result['budget']}: " + ("ok" if result["within_budget"] else
                                                         f"EXCEEDED in frames {result['frames_over_budget']}")
        elif doc["meta"].get("budget") is not None:
            budget = "  (reported only: the budget is the fast path's)"
        else:
            budget = ""
        lines.append(f"[{result['path']}] {result['frames']} frames{emulated}: syncs per frame "
                     f"max {result['max_syncs_per_frame']} mean {result['mean_syncs_per_frame']:.1f}, "
                     f"setup {result['setup_syncs']}{budget}")
        if result["cuda_sync_debug_per_frame"] is not None:
            lines.append(f"  torch.cuda sync debug mode per frame: {result['cuda_sync_debug_per_frame']}")
        lines.append(f"  {'per frame':>9}  {'op':<12} {'site':<44} code")
        for s in result["sites"]:
            rate = "setup" if s["setup"] else f"{s['per_frame']:.1f}"
            lines.append(f"  {rate:>9}  {s['op']:<12} {s['site']:<44} {s['code'][:70]}")
    return "\n".join(lines)
