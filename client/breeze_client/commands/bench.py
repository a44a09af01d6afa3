"""`breeze-client bench`: the end-to-end streaming benchmark through a running worker (breeze_client/bench.py).

    breeze-client bench --target gpu-host:50051 --labels short,medium,long --iterations 5 --concurrency 4
    breeze-client bench --labels chunk-4.80s --frames 8 --json        # quick, machine-readable

Prints one table row per label; --json prints the whole document (every statistic, per-round throughput).
A failed request is counted by status code per label ("fail" column, `errors` in the JSON) and left out of
the statistics; the exit status is 1 only when no request of the whole run completed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from breeze_client import jsonout
from breeze_client.bench import LABELS, RequestMix, run_bench
from breeze_client.channel import ConnectionOptions
from breeze_client.commands._local import readable_file
from breeze_client.commands._output import Progress
from breeze_client.errors import InvalidArgument
from breeze_client.sdk import BreezeClient


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--labels", default=",".join(LABELS),
                   help=f"comma-separated labels (default: all): {', '.join(LABELS)}")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds per label (default 1)")
    p.add_argument("--iterations", type=int, default=3, help="timed rounds per label (default 3)")
    p.add_argument("--concurrency", type=int, default=1, help="clients sending at once, one channel each")
    p.add_argument("--frames", type=int, default=None,
                   help="frame limit for every label (default: each label's own, sized from its text)")
    p.add_argument("--seed", type=int, default=1, help="base seed (request i of round r: seed + 1000 r + i)")
    p.add_argument("--instruction", default=None, help="speaking instruction for every request")
    p.add_argument("--cfg-scale", type=float, default=None, help="classifier-free guidance scale")
    p.add_argument("--cfg-every", type=int, default=0, metavar="N",
                   help="a request mix: every Nth client sends an instruction with CFG (2: half of them)")
    p.add_argument("--clone-every", type=int, default=0, metavar="N",
                   help="a request mix: every Nth client clones --reference (4: a quarter of them)")
    p.add_argument("--reference", default=None, metavar="FILE", help="reference audio (WAV/FLAC/OGG) to clone")
    p.add_argument("--reference-text", default=None, help="the reference's exact transcript")


def _f(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def table(doc: dict) -> str:
    m = doc["meta"]
    head = (f"{'label':<14}{'words':>6}{'frames':>8}{'req':>5}{'wall s':>8}{'sd':>7}{'min':>7}{'max':>7}"
            f"{'audio s':>8}{'RTF':>7}{'fr/s':>7}{'TTFA ms':>9}{'p90':>7}{'ICL p50':>8}{'p90':>7}{'p99':>7}"
            f"{'xRT':>7}{'fail':>6}")
    lines = [f"worker {m['target']}: {m['worker_model']}",
             f"streaming, {m['concurrency']} client(s) at once, {m['warmup']} warm-up + {m['iterations']} timed "
             f"round(s) per label",
             f"note: {m['frame_limit_note']}", head, "-" * len(head)]
    for s in doc["labels"]:
        w, t, icl = s["wall_s"], s["ttfa_ms"], s["inter_chunk_ms"]
        frames = f"{_f(s['frames']['mean'], '.0f')}/{s['frame_limit']}"
        lines.append(
            f"{s['label']:<14}{s['words']:>6}{frames:>8}{s['requests']:>5}{_f(w['mean']):>8}{_f(w['stddev']):>7}"
            f"{_f(w['min']):>7}{_f(w['max']):>7}{_f(s['audio_s']['mean']):>8}{_f(s['rtf']['mean'], '.3f'):>7}"
            f"{_f(s['frames_per_s']['mean'], '.1f'):>7}{_f(t['mean'], '.1f'):>9}{_f(t['p90'], '.1f'):>7}"
            f"{_f(icl['p50'], '.1f'):>8}{_f(icl['p90'], '.1f'):>7}{_f(icl['p99'], '.1f'):>7}"
            f"{_f(s['aggregate_x_realtime']['mean'], '.2f'):>7}{s['attempted'] - s['requests']:>6}")
    for s in doc["labels"]:
        if s["errors"]:
            codes = ", ".join(f"{code} x{n}" for code, n in sorted(s["errors"].items()))
            lines.append(f"{s['label']}: {s['attempted'] - s['requests']} of {s['attempted']} requests failed "
                         f"({codes}); left out of the statistics")
    lines.append("frames: mean frames / frame limit; RTF: wall / audio (lower is better); TTFA: request sent -> "
                 "first chunk; ICL: inter-chunk latency (ms); xRT: audio s per wall s of a whole round; fail: failed "
                 "requests")
    return "\n".join(lines)


def run(args: argparse.Namespace, options: ConnectionOptions) -> int:
    labels = [name for name in args.labels.split(",") if name]
    extra = {k: v for k, v in (("instruction", args.instruction), ("cfg_scale", args.cfg_scale)) if v is not None}
    mix = None
    if args.cfg_every or args.clone_every:
        if args.clone_every and not (args.reference and args.reference_text):
            raise InvalidArgument("--clone-every needs --reference FILE (the audio to clone) and --reference-text "
                                  "(its exact words)")
        if args.reference:
            readable_file("--reference", args.reference, "audio file (WAV, FLAC or OGG)")
        mix = RequestMix(cfg_every=args.cfg_every, clone_every=args.clone_every,
                         reference_audio=Path(args.reference).read_bytes() if args.reference else None,
                         reference_text=args.reference_text,
                         **({"cfg_scale": args.cfg_scale} if args.cfg_scale is not None else {}),
                         **({"instruction": args.instruction} if args.instruction else {}))
        extra = {}  # the mix decides each client's instruction and scale
    progress = Progress("bench")
    try:
        doc = run_bench(lambda: BreezeClient(options=options), labels, warmup=args.warmup,
                        iterations=args.iterations, concurrency=args.concurrency, seed=args.seed,
                        frames=args.frames, options=extra, timeout_s=options.timeout_s, progress=progress.step,
                        mix=mix)
    finally:
        progress.done()
    if doc["meta"]["worker_is_tiny_default"]:
        print("warning: the worker serves the tiny default (random weights): timings are not Breeze TTS 2's",
              file=sys.stderr)
    jsonout.write(doc, args.json)
    print(table(doc))
    if not any(s["requests"] for s in doc["labels"]):
        print("error: no request completed", file=sys.stderr)
        return 1
    return 0
