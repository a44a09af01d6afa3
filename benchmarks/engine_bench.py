#!/usr/bin/env python3
"""The engine benchmark, batch 1: milliseconds per 80 ms frame of the eager reference and of the fast path,
with and without CFG, per precision policy; time to first audio and its split (text encode, prefill, first
frame, codec); host syncs per frame; GPU-busy fraction and kernel count of a profiled request; peak memory;
the bandwidth floor (weight bytes a frame over the measured copy bandwidth) and the T4 projection.
`--check` adds fast == eager frame by frame (FP32).

This is `breeze-worker bench` (worker/breeze_worker/commands/bench.py), run from a checkout without an
install; `--json FILE` writes every figure with the device, commit, torch and Python versions (schema in
worker/breeze_worker/measure/report.py). The concurrency sweep is benchmarks/concurrency_sweep.py.

    python benchmarks/engine_bench.py --device cuda --size full --precision bf16 --cfg on \\
        --paths eager,fast --frames 64 --eager-frames 8 --capacity 256 --json engine.json
"""

from __future__ import annotations

import argparse
import sys

import bench_env


def parser() -> argparse.ArgumentParser:
    from breeze_worker.commands import bench

    p = argparse.ArgumentParser(prog="benchmarks/engine_bench.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log-level", default="WARNING", help="logging level (DEBUG, INFO, WARNING, ...)")
    bench.add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    bench_env.use_source_tree()
    from breeze_worker.commands import bench

    p = parser()
    args = p.parse_args(argv)
    if args.concurrency:
        p.error("--concurrency: the sweep is benchmarks/concurrency_sweep.py")
    bench_env.start_run(args)
    return int(bench.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
