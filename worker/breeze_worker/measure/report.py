"""Derived figures of the engine benchmark (bandwidth floor, T4 projection, targets) and its outputs
(a terminal table and a JSON document, schema `breeze-bench/1`).

Bandwidth floor: a frame must stream every weight it uses once per backbone step and once per depth step:
    bytes/frame = backbone layers + final norm + lm_head + 15 x (depth layers + norm + input projector)
                  + the 15 codebook heads (one slice per depth step)
    floor = bytes/frame / measured device copy bandwidth (bytes read + written per second).
(KV-cache reads, embedding rows and activations are small at batch 1 and left out.)

T4 projection: t_T4 = bytes/frame under fp16-mixed / 320 GB/s + overhead, where overhead = measured fast
ms/frame - this device's floor (launch gaps, small-kernel latency, sampling: the part not explained by
streaming weights), carried over unchanged. It is a lower bound: a T4 launches and runs small kernels
more slowly than the device measured here.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from breeze_worker import jsonout

SCHEMA = "breeze-bench/1"
T4_BANDWIDTH = 320e9
TARGET_MS_PER_FRAME = 8.0
TARGET_SPEEDUP = 15.0
TARGET_TTFA_MS = 40.0


def _bytes(module: nn.Module) -> int:
    seen, total = set(), 0
    for t in module.parameters():
        key = id(t) if t.is_meta else t.data_ptr()  # meta tensors have no storage (the doctor's estimates)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def bytes_per_frame(lm) -> dict:
    """Weight bytes one frame streams (see the module docstring), by part."""
    backbone = _bytes(lm.backbone_model) + _bytes(lm.lm_head)
    depth_model = lm.depth_decoder.model
    depth_step = sum(_bytes(m) for m in (depth_model.layers, depth_model.norm, depth_model.inputs_embeds_projector))
    heads = _bytes(lm.depth_decoder.codebooks_head)
    steps = lm.config.num_codebooks - 1
    return {"backbone": backbone, "depth_per_step": depth_step, "depth_steps": steps, "codebook_heads": heads,
            "total": backbone + steps * depth_step + heads}


def floor_ms(total_bytes: int, bandwidth: float | None) -> float | None:
    return None if not bandwidth else 1000.0 * total_bytes / bandwidth


def t4_projection(fast_ms: float | None, floor_here_ms: float | None, t4_bytes: int) -> dict:
    t4_floor = 1000.0 * t4_bytes / T4_BANDWIDTH
    if fast_ms is None or floor_here_ms is None:
        return {"t4_floor_ms": t4_floor, "overhead_ms": None, "projected_ms_per_frame": None, "projected_rtf": None}
    overhead = max(fast_ms - floor_here_ms, 0.0)
    projected = t4_floor + overhead
    return {"formula": "bytes_per_frame(fp16-mixed) / 320 GB/s + (measured fast ms/frame - floor here)",
            "t4_floor_ms": t4_floor, "overhead_ms": overhead, "projected_ms_per_frame": projected,
            "projected_rtf": projected / 80.0}


def targets(variants: list[dict]) -> dict:
    """The batch-1 targets with CFG on (TARGET_MS_PER_FRAME, TARGET_SPEEDUP over eager, TARGET_TTFA_MS) per
    precision and fast path."""
    by = {(v["path"], v["cfg"], v.get("precision")): v for v in variants}
    out = {}
    for (path, cfg, precision), fast in by.items():
        if path == "eager" or not cfg:
            continue
        eager = by.get(("eager", True, precision))
        speedup = (eager["ms_per_frame"] / fast["ms_per_frame"]) if eager and fast["ms_per_frame"] else None
        out[precision if path == "fast" else f"{precision}/{path}"] = {
            "fast_ms_per_frame": fast["ms_per_frame"], "target_ms_per_frame": TARGET_MS_PER_FRAME,
            "meets_ms_per_frame": fast["ms_per_frame"] is not None and fast["ms_per_frame"] <= TARGET_MS_PER_FRAME,
            "speedup_vs_eager": speedup, "target_speedup": TARGET_SPEEDUP,
            "meets_speedup": speedup is not None and speedup >= TARGET_SPEEDUP,
            "ttfa_ms": fast["ttfa_ms"], "target_ttfa_ms": TARGET_TTFA_MS,
            "meets_ttfa": fast["ttfa_ms"] <= TARGET_TTFA_MS,
        }
    return out


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _gib(value: int | None) -> str:
    return _fmt(None if value is None else value / 2**30)


def _syncs(v: dict) -> str:
    lm, codec = v.get("host_syncs_per_frame_lm"), v.get("host_syncs_per_frame_codec")
    if lm is None:
        return _fmt(v.get("host_syncs_per_frame"), ".1f")
    return f"{lm:.1f}+{_fmt(codec, '.1f')}"


def table(doc: dict) -> str:
    head = (f"{'variant':<26}{'ms/frame':>10}{'RTF':>8}{'TTFA ms':>9}{'enc ms':>8}{'prefill':>9}{'codec ms':>9}"
            f"{'peak GiB':>9}{'resv GiB':>9}{'RSS GiB':>8}{'syncs lm+codec':>15}{'busy':>6}{'floor x':>8}")
    lines = [head, "-" * len(head)]
    for v in doc["variants"]:
        s = v["stages_s"]
        floor = v.get("floor_ms")
        ratio = (v["ms_per_frame"] / floor) if floor and v["ms_per_frame"] else None
        codec = s.get("codec_s")
        lines.append(
            f"{v['name']:<26}{_fmt(v['ms_per_frame']):>10}{_fmt(v['rtf'], '.3f'):>8}{_fmt(v['ttfa_ms'], '.1f'):>9}"
            f"{_fmt(1000 * s['text_encode_s'], '.1f'):>8}{_fmt(1000 * s['prefill_s'], '.1f'):>9}"
            f"{_fmt(None if codec is None else 1000 * codec / max(v['frames'], 1), '.2f'):>9}"
            f"{_gib(v['peak_memory_bytes']):>9}{_gib(v.get('gpu_peak_reserved_bytes')):>9}"
            f"{_gib(v.get('host_peak_rss_bytes')):>8}{_syncs(v):>15}{_fmt(v['gpu_busy_fraction']):>6}"
            f"{_fmt(ratio, '.1f'):>8}")
    lines.append("peak: GPU allocated; resv: GPU reserved (the allocator's pool, what nvidia-smi shows); RSS: host "
                 "peak resident set; syncs: host syncs per frame (language model + codec)")
    for precision, t in doc.get("targets", {}).items():
        lines.append(f"targets [{precision}, CFG on]: {_fmt(t['fast_ms_per_frame'])} ms/frame (<= 8: "
                     f"{t['meets_ms_per_frame']}), x{_fmt(t['speedup_vs_eager'], '.1f')} vs eager (>= 15: "
                     f"{t['meets_speedup']}), TTFA {_fmt(t['ttfa_ms'], '.1f')} ms (<= 40: {t['meets_ttfa']})")
    t4 = doc.get("t4_projection") or {}
    if t4.get("projected_ms_per_frame") is not None:
        lines.append(f"T4 projection: floor {t4['t4_floor_ms']:.1f} ms + overhead {t4['overhead_ms']:.1f} ms = "
                     f"{t4['projected_ms_per_frame']:.1f} ms/frame (RTF {t4['projected_rtf']:.2f}, a lower bound)")
    return "\n".join(lines)


def write_json(doc: dict, path: str | Path) -> None:
    clean = {**doc, "variants": [{k: v for k, v in var.items() if not k.startswith("_")} for var in doc["variants"]]}
    jsonout.write(clean, path, default=_json_default)


def _json_default(value):
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
