#!/usr/bin/env python3
"""What the worker's own CPU evidence costs: a group commit and a Fetch with its sampling on and off.

The worker samples its threads' scheduler counters and its cgroup's CPU-quota counters around each commit,
final message and Fetch (breeze_worker/threadcpu.py); every sample is a few reads of /proc and cgroup files
in the serving path. This times, in one process and taking turns so that the host's load falls on both
alike: a group commit of --artifacts WAVs of --frames frames (24 kHz s16) in --dir, and a Fetch of one job's
artifact from an in-process worker (tiny embedded default, CPU, loopback), each --turns times with the
sampling as it is and with `threadcpu`'s readers replaced by ones that read nothing. It prints the medians
and the ratio.

    python benchmarks/cpu_evidence_cost.py [--dir /dev/shm] [--artifacts 3] [--frames 48] [--turns 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_env

bench_env.use_source_tree()
sys.path.insert(0, str(bench_env.ROOT / "tests"))  # netpath: the in-process worker

from breeze_worker import threadcpu  # noqa: E402

_REAL = (threadcpu.held, threadcpu.sample, threadcpu.throttled)


def sampling(on: bool) -> None:
    """threadcpu's readers as they are, or ones that read nothing (the evidence then goes unset)."""
    if on:
        threadcpu.held, threadcpu.sample, threadcpu.throttled = _REAL
    else:
        threadcpu.held = lambda tid=None: threadcpu.Held(None, {}, 0)
        threadcpu.sample = lambda tid=None: None
        threadcpu.throttled = dict


def _turns(turns: int, once) -> dict[bool, list[float]]:
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for i in range(turns * 2):
            on = i % 2 == 0
            sampling(on)
            times[on].append(once())
    finally:
        sampling(True)
    return times


def commits(directory: Path, artifacts: int, frames: int, turns: int) -> dict[bool, list[float]]:
    from breeze_worker.artifacts.store import ArtifactStore
    from breeze_worker.config import ArtifactSettings
    from breeze_worker.engine.types import PcmEncoding

    store = ArtifactStore(ArtifactSettings(directory=directory, min_free_bytes=1 << 20))
    pcm = b"\0" * (frames * 1920 * 2)  # 1920 samples a frame

    def once() -> float:
        writers = [store.begin(f"job-{k}", 24000, PcmEncoding.S16LE) for k in range(artifacts)]
        for w in writers:
            w.append(pcm)
        t0 = time.perf_counter_ns()
        store.commit_together(writers)
        elapsed = (time.perf_counter_ns() - t0) / 1e6
        for w in writers:
            store.delete(w.artifact_id)
        return elapsed

    return _turns(turns, once)


def fetches(directory: Path, frames: int, turns: int) -> tuple[dict[bool, list[float]], int]:
    from netpath.worker import InProcessWorker

    from breeze_client.sdk import BreezeClient

    with InProcessWorker(directory) as worker, \
            BreezeClient(worker.target, artifact_target=worker.artifact_target) as client:
        job = client.synthesize("What the evidence costs.", max_frames=frames, collect_audio=False)

        def once() -> float:
            t0 = time.perf_counter_ns()
            client.fetch(job.artifact, None)
            return (time.perf_counter_ns() - t0) / 1e6

        return _turns(turns, once), job.artifact.size_bytes


def _line(what: str, times: dict[bool, list[float]]) -> str:
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return (f"{what}: {on:.3f} ms with the CPU evidence, {off:.3f} ms without (medians of {len(times[True])} turns "
            f"each): {on / off:.3f}x, +{(on - off) * 1e3:.0f} us")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=None, help="where the artifacts go (default: a temporary directory)")
    p.add_argument("--artifacts", type=int, default=3, help="WAVs in each group commit")
    p.add_argument("--frames", type=int, default=48, help="frames a WAV (12.5 a second)")
    p.add_argument("--turns", type=int, default=300)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="cpu-evidence-", dir=args.dir) as d:
        (Path(d) / "commit").mkdir()
        print(_line(f"group commit of {args.artifacts} WAVs of {args.frames} frames",
                    commits(Path(d) / "commit", args.artifacts, args.frames, args.turns)))
        times, size = fetches(Path(d) / "fetch", args.frames, args.turns)
        print(_line(f"fetch of one {size:,}-byte artifact", times))


if __name__ == "__main__":
    main()
