"""`breeze-client diagnose`: name the phase that holds a slow retrieval, with its evidence and the fix.

Runs N synthesis jobs (or takes existing artifact ids), fetches each artifact as soon as its job ends, and
prints per-phase p50/p95/max, the commit -> request wait, and the verdict: healthy, or the cause its
evidence names and the phase that holds the time, a few lines of that evidence, the fix, and the rest. The
clock mapping is checked around every run. `--chunk-sizes` and `--compressions` sweep fetch configurations
over the same artifacts. `--json` prints one object; `--report FILE.html` writes a self-contained page with
the verdict, the phase table and a waterfall per run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from breeze_client import jsonout
from breeze_client.channel import ConnectionOptions
from breeze_client.commands._local import writable_dir, writable_file
from breeze_client.commands._output import Progress
from breeze_client.diagnose import DEFAULT_TEXT, DiagnoseSettings, format_text, run_diagnosis, sweep_configs
from breeze_client.report import write_report
from breeze_client.sdk import BreezeClient

MAX_CHUNK_BYTES = 4 * 1024 * 1024  # the worker's limit per Fetch chunk


def _sizes(text: str) -> list[int]:
    """'65536,256k,1m,0' -> bytes (0 = the worker's default); each 0 or 1 B .. 4 MiB, checked before any job."""
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        scale = {"k": 1024, "m": 1024 * 1024}.get(item[-1:], 1)
        digits = item[:-1] if scale > 1 else item
        if digits.startswith("-") and digits[1:].isdigit():
            raise argparse.ArgumentTypeError(f"{item} is negative: use 0 (the worker's default) or 1 byte .. 4m")
        if not digits.isdigit():
            raise argparse.ArgumentTypeError(f"{item!r} is not a size: use bytes, 256k or 1m (0 = the worker's "
                                             "default)")
        size = int(digits) * scale
        if size > MAX_CHUNK_BYTES:
            raise argparse.ArgumentTypeError(f"{item} is more than the 4m (4 MiB) a chunk may hold: use 0 (the "
                                             "worker's default) or 1 byte .. 4m")
        out.append(size)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact_ids", nargs="*", help="diagnose these existing artifacts instead of running jobs")
    p.add_argument("-n", "--jobs", type=int, default=3, help="synthesis jobs to run (default %(default)s)")
    p.add_argument("--text", default=DEFAULT_TEXT, help="text of each job")
    p.add_argument("--max-frames", type=int, default=None, help="frame limit per job (12.5 frames per second)")
    p.add_argument("--seed", type=int, default=1, help="seed of the first job (the next ones add 1)")
    p.add_argument("--encoding", choices=("s16le", "f32le"), default="s16le",
                   help="the jobs' PCM encoding (f32le moves twice the bytes; default %(default)s)")
    p.add_argument("--chunk-sizes", type=_sizes, default=[0], metavar="LIST",
                   help="fetch chunk sizes to sweep, e.g. 64k,256k,1m (0 = the worker's default); the first "
                        "is the one diagnosed")
    p.add_argument("--compressions", default="none", metavar="LIST",
                   help="compressions to sweep: none, zstd or none,zstd (the first is the one diagnosed)")
    p.add_argument("--parallel", action="store_true",
                   help="run the jobs at once, each fetched as it ends (with artifact ids: fetch them all at once)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="keep the fetched files here (default: a temporary directory, removed afterwards)")
    p.add_argument("--report", type=Path, default=None, metavar="FILE.html",
                   help="write a self-contained HTML report (waterfall per run, phase table)")


def run(args: argparse.Namespace, options: ConnectionOptions) -> int:
    compressions = [c.strip() for c in args.compressions.split(",") if c.strip()]
    bad = [c for c in compressions if c not in ("none", "zstd")]
    if bad:
        raise ValueError(f"--compressions takes none and/or zstd, not {','.join(bad)}")
    if args.jobs < 1:
        raise ValueError("--jobs must be at least 1")
    if args.out_dir is not None:
        writable_dir("--out-dir", args.out_dir)
    if args.report is not None:
        writable_file("--report", args.report)
    settings = DiagnoseSettings(jobs=args.jobs, text=args.text, artifact_ids=tuple(args.artifact_ids),
                                max_frames=args.max_frames, seed=args.seed,
                                configs=sweep_configs(args.chunk_sizes, compressions), out_dir=args.out_dir,
                                parallel=args.parallel, encoding=args.encoding)
    progress = Progress("diagnose")
    with BreezeClient(options=options) as client:
        try:
            result = run_diagnosis(client, settings, progress=progress.step)
        finally:
            progress.done()
    if args.report is not None:
        write_report(args.report, result.diagnosis, result.timelines, sweep=result.sweep_rows(),
                     meta={k: v for k, v in result.meta.items() if k != "date_unix_s"})
    out = result.to_dict()
    out["report"] = None if args.report is None else str(args.report)
    jsonout.write(out, args.json)
    print(format_text(result))
    if args.report is not None:
        print(f"\nreport: {args.report}")
    return 0
