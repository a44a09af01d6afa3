#!/usr/bin/env python
"""Group commit: how long the artifact store takes to commit the WAVs of jobs that end at one step.

The jobs of a batched step end together, and each one's final message waits for the group's commit (headers,
sync, read-back for the hashes, renames, sidecars, directory sync: artifacts/store.py). This writes --streams
artifacts of --frames frames (24 kHz s16, the size a 64-stream round of the serve benchmark writes) into
--dir, commits them as one group, and times it, --commits times a turn, in this checkout and, with --tree, in
another source tree, in separate processes taking turns (--rounds) on the same volume. It prints each tree's
median commit time and each step's (from the artifacts' own commit timing) and the ratio.

The frames are written as a round writes them: one frame for every artifact each --step-ms (the engine step at
that many streams; 18.5 ms is the H200's at 64, docs/perf-data/serve-d8bcb0a-20261204.json), so the kernel's
write-back can run while they stream, and the commit follows the last frame at once. --step-ms 0 writes
everything at once, then waits 0.2 s.

    python benchmarks/group_commit.py --dir /var/lib/breeze/artifacts-bench --tree ../baseline --json commit.json

Run it on the volume the worker's artifacts use: the figure is that volume's sync time as much as the code's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_env import child_json, compare_trees, describe, take_turns, use_source_tree, write_json

SAMPLES_PER_FRAME = 1920
STEPS = ("wav_fsync_ns", "hash_ns", "rename_ns", "sidecar_fsync_ns", "dir_fsync_ns")


def measure(directory: Path, streams: int, frames: int, commits: int, step_s: float) -> dict:
    """Commit times (ms) of `commits` groups, and each step's (ms, the first artifact's: the group's)."""
    from breeze_worker.artifacts.store import ArtifactStore
    from breeze_worker.config import ArtifactSettings
    from breeze_worker.engine.types import PcmEncoding

    store = ArtifactStore(ArtifactSettings(directory=directory))
    pcm = os.urandom(frames * SAMPLES_PER_FRAME * 2)
    totals, steps = [], {name: [] for name in STEPS}
    for _ in range(commits):
        writers = [store.begin(f"bench-{i}", 24000, PcmEncoding.S16LE) for i in range(streams)]
        step_at = time.perf_counter()
        for start in range(0, len(pcm), SAMPLES_PER_FRAME * 2):  # a frame for every stream a step
            for w in writers:
                w.append(pcm[start:start + SAMPLES_PER_FRAME * 2])
            step_at += step_s
            time.sleep(max(0.0, step_at - time.perf_counter()))
        if step_s == 0:
            time.sleep(0.2)  # the pages wait for write-back a little, as the last frames of a round do
        start = time.perf_counter_ns()
        infos = store.commit_together(writers)
        totals.append((time.perf_counter_ns() - start) / 1e6)
        if any(info is None for info in infos):
            raise RuntimeError("an artifact was given up: " + "; ".join(
                str(w.unavailable_reason) for w in writers if w.unavailable_reason))
        for name in STEPS:
            steps[name].append(getattr(infos[0].commit, name) / 1e6)
        for info in infos:
            store.delete(info.artifact_id)
    return {"commit_ms": totals, "steps_ms": steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory); emptied after")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--frames", type=int, default=96)
    p.add_argument("--commits", type=int, default=3, help="group commits in a turn")
    p.add_argument("--step-ms", type=float, default=18.5, help="time between a round's frames (0: all at once)")
    p.add_argument("--rounds", type=int, default=6, help="turns each tree takes, alternated")
    p.add_argument("--tree", default=None, help="another source tree to compare (a baseline checkout)")
    p.add_argument("--json", default=None)
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        import json

        print(json.dumps(measure(Path(args.measure), args.streams, args.frames, args.commits, args.step_ms / 1e3)))
        return
    use_source_tree()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="group-commit-"))
    directory = base / "store"

    def turn(tree: Path | None) -> dict:
        try:
            return child_json(__file__, ["--measure", str(directory), "--streams", str(args.streams), "--frames",
                                         str(args.frames), "--commits", str(args.commits), "--step-ms",
                                         str(args.step_ms)], tree)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    try:
        turns = take_turns(args.tree, args.rounds, turn)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    summary: dict = {}
    for name, runs in turns.items():
        totals = [ms for run in runs for ms in run["commit_ms"]]
        steps = {step: statistics.median(ms for run in runs for ms in run["steps_ms"][step]) for step in STEPS}
        summary[name] = {"commit_ms_median": statistics.median(totals), "commit_ms_range": [min(totals), max(totals)],
                         "steps_ms_median": steps}
        cells = ", ".join(f"{step.removesuffix('_ns')} {ms:.1f}" for step, ms in steps.items())
        median = summary[name]["commit_ms_median"]
        print(f"{name}: {args.streams} artifacts of {args.frames} frames committed in {median:.1f} ms (median of "
              f"{len(totals)}; range {min(totals):.1f}-{max(totals):.1f}); steps: {cells}")
    compare_trees(summary, "commit_ms_median", "the commit time")
    if args.json:
        write_json(args.json, {"schema": "breeze-group-commit/1", "meta": describe(), "tree": args.tree,
                               "dir": str(base), "streams": args.streams, "frames": args.frames,
                               "commits": args.commits, "rounds": args.rounds, "step_ms": args.step_ms, **summary})


if __name__ == "__main__":
    main()
