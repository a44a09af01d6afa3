#!/usr/bin/env python3
"""The batched engine's concurrency sweep: N streams arriving together (half of them with CFG, end of speech
masked) through the engine's own batched stepper and batched codec, for each N of `--concurrency`. Per N:
aggregate real-time factor (audio seconds per wall second) and its steady state, per-stream RTF, time to
first audio p50 / p95, the step time split into the language model's and the codec's, the language model's
step without the codec, peak GPU memory; optionally the frames batched vs alone (`--agreement-streams`),
the batch-1 fast path on the same model (`--batch1`) and a kernel profile (`--profile-streams`).

This is `breeze-worker bench --concurrency ...` (worker/breeze_worker/commands/bench_concurrency.py), run
from a checkout without an install; `--json FILE` writes it all with the device and commit, rewritten after
each phase (a run cut short keeps what it measured).

    python benchmarks/concurrency_sweep.py --device cuda --size full --precision bf16 \\
        --concurrency 1,2,4,8,16,32 --frames 48 --capacity 256 --batch-shapes sweep --batch1 --json sweep.json
"""

from __future__ import annotations

import argparse
import sys

import bench_env

DEFAULT_LEVELS = "1,2,4,8,16,32"


def parser() -> argparse.ArgumentParser:
    from breeze_worker.commands import bench

    p = argparse.ArgumentParser(prog="benchmarks/concurrency_sweep.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log-level", default="WARNING", help="logging level (DEBUG, INFO, WARNING, ...)")
    bench.add_arguments(p)
    p.set_defaults(concurrency=DEFAULT_LEVELS, frames=48)
    return p


def main(argv: list[str] | None = None) -> int:
    bench_env.use_source_tree()
    from breeze_worker.commands import bench_concurrency

    args = parser().parse_args(argv)
    bench_env.start_run(args)
    return int(bench_concurrency.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
