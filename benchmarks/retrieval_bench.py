#!/usr/bin/env python3
"""Retrieval benchmark: from generation done to all three of the user's files on disk.

The user's three files are 13.76 s, 7.36 s and 4.80 s of 24 kHz mono s16le audio (172, 92 and 60 frames).
Each iteration runs the three jobs at once on a worker (tiny embedded default, CPU), waits
until the last job's final message has arrived, then fetches the three artifacts in parallel over the
artifact channel (fsynced, SHA-256 verified). The number is

    retrieval = last file fsynced - last job's generation done      (worker time mapped to the client clock)

so every byte of all three files moves after the GPU finished. Two paths:
  loopback  client and worker on 127.0.0.1                                   target <= 150 ms
  wan       both channels through a veth pair between two namespaces made here, tbf 20 Mbit/s each way,
            and a delaying proxy adding 25 ms each way (50 ms RTT)             target <= 1.5 x floor,
            floor = total bytes / rate + one round trip
The wan path needs root and iproute2 (it is skipped with a note otherwise) and runs in its own process
(tests/netpath/pathd.py), as does the worker (`breeze-worker serve`), so neither takes CPU from the measured
client. Both numbers span the worker's and the client's clocks, so each is printed with the clock mapping's
uncertainty (±U, the largest over the iterations). Prints both numbers; `--json FILE` writes them with the
host, date and commit, every iteration's per-file phases and `tc -s qdisc` of the wan path after its runs.

    python benchmarks/retrieval_bench.py [--iterations 3] [--chunk-size 0] [--skip-wan] [--in-process] \
        [--json retrieval.json]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bench_env

bench_env.use_source_tree()
sys.path.insert(0, str(bench_env.ROOT / "tests"))  # netpath: the namespaces, the shaped link, the proxy

from breeze_client.diagnose import FetchConfig, fetch_many, timeline_from_results  # noqa: E402
from breeze_client.phases import phases_dict  # noqa: E402
from breeze_client.sdk import BreezeClient  # noqa: E402
from breeze_client.verdict import diagnose  # noqa: E402

FILES = (("13.76 s", 172), ("7.36 s", 92), ("4.80 s", 60))  # 12.5 frames per second
TEXT = "The artifact path itself must not be the problem."
LOOPBACK_TARGET_S = 0.150
WAN_RATIO_TARGET = 1.5
log = logging.getLogger("bench_retrieval")


def one_iteration(client: BreezeClient, config: FetchConfig, seed: int) -> dict:
    with ThreadPoolExecutor(max_workers=len(FILES)) as pool:
        jobs = list(pool.map(lambda f: client.synthesize(TEXT, max_frames=f[1], seed=seed, collect_audio=False),
                             FILES))
    for (label, frames), job in zip(FILES, jobs):
        if job.stats.frames != frames or job.artifact is None:
            raise RuntimeError(f"the {label} job produced {job.stats.frames} frames, not {frames}")
    with tempfile.TemporaryDirectory(prefix="bench-retrieval-") as out:
        fetched = fetch_many(client, [j.artifact for j in jobs], Path(out), config, parallel=True)
        sizes = [os.path.getsize(Path(out) / f"{j.artifact.artifact_id}.wav") for j in jobs]
    synth_clock = client.clock()
    timelines = [timeline_from_results(label, fr, synthesis=job, timed_file=tf, clock=synth_clock, parallel=len(FILES))
                 for (label, _), job, (fr, tf) in zip(FILES, jobs, fetched)]
    if not all(t.extra["verified"] for t in timelines) or sizes != [t.file_bytes for t in timelines]:
        raise RuntimeError("a fetched file is incomplete or failed its SHA-256 check")
    last_done = max(t.events["generation_done"] for t in timelines)
    last_final = max(t.events["final_received"] for t in timelines)
    last_disk = max(t.events["file_fsynced"] for t in timelines)
    return {
        "retrieval_s": (last_disk - last_done) / 1e9,
        "final_message_to_disk_s": (last_disk - last_final) / 1e9,
        "clock_uncertainty_s": max(t.clock_uncertainty_ns for t in timelines) / 1e9,
        "total_bytes": sum(t.file_bytes for t in timelines),
        "files": [{"file": t.label, "bytes": t.file_bytes, "resumes": t.resumes, "phases": phases_dict(t)}
                  for t in timelines],
        "_timelines": timelines,
    }


def run_path(name: str, target: str, artifact_target: str, iterations: int, config: FetchConfig) -> dict:
    with BreezeClient(target, artifact_target=artifact_target, timeout_s=300) as client:
        client.clock()
        client.clock(artifact_target)
        warm = client.synthesize(TEXT, max_frames=4, seed=0, collect_audio=False)  # warm channels and caches
        client.fetch(warm.artifact, None)
        runs = [one_iteration(client, config, seed=i + 1) for i in range(iterations)]
    # the verdict is about the job that finished last in each iteration: the others' client gap holds the
    # benchmark's deliberate wait for the whole batch
    timelines = [max(r.pop("_timelines"), key=lambda t: t.events["generation_done"]) for r in runs]
    values = sorted(r["retrieval_s"] for r in runs)
    d = diagnose(timelines)
    return {"path": name, "iterations": runs, "retrieval_s_median": values[len(values) // 2],
            "retrieval_s_max": values[-1], "total_bytes": runs[0]["total_bytes"],
            "retrieval_uncertainty_s": max(r["clock_uncertainty_s"] for r in runs),
            "verdict": d.verdict.to_dict(), "phases": {k: v.to_dict() for k, v in d.summaries.items()}}


def run_wan(worker, iterations: int, config: FetchConfig, rate_mbit: float, rtt_ms: float) -> dict:
    from netpath.pathd import PathProcess

    with PathProcess([worker.target, worker.artifact_target], rate_mbit=rate_mbit, delay_ms=rtt_ms / 2) as path:
        result = run_path("wan", path.entries[0], path.entries[1], iterations, config)
        result["qdisc"] = path.qdisc()  # after the traffic: the tbf counters show the bytes it shaped
    floor = result["total_bytes"] * 8 / (rate_mbit * 1e6) + rtt_ms / 1e3
    result.update(rate_mbit=rate_mbit, added_rtt_ms=rtt_ms, floor_s=floor,
                  ratio_to_floor=result["retrieval_s_median"] / floor,
                  ratio_uncertainty=result["retrieval_uncertainty_s"] / floor, target_ratio=WAN_RATIO_TARGET,
                  passed=result["retrieval_s_median"] <= WAN_RATIO_TARGET * floor)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/retrieval_bench.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--chunk-size", type=int, default=0, help="fetch chunk size (0 = the worker's default)")
    p.add_argument("--compression", choices=("none", "zstd"), default="none")
    p.add_argument("--rate-mbit", type=float, default=20.0)
    p.add_argument("--rtt-ms", type=float, default=50.0)
    p.add_argument("--skip-wan", action="store_true")
    p.add_argument("--in-process", action="store_true",
                   help="run the worker in this process (default: `breeze-worker serve` as a subprocess)")
    p.add_argument("--commit", default=None, help="commit to record (default: $BREEZE_COMMIT, else git)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from netpath.worker import InProcessWorker, WorkerProcess

    config = FetchConfig(args.chunk_size, args.compression)
    report = {"benchmark": "retrieval", "meta": bench_env.describe(args.commit), "cpus": os.cpu_count(),
              "files": [{"audio": a, "frames": f} for a, f in FILES], "fetch_config": config.label}
    report["worker"] = "in-process" if args.in_process else "subprocess"
    with (InProcessWorker() if args.in_process else WorkerProcess()) as worker:
        loop = run_path("loopback", worker.target, worker.artifact_target, args.iterations, config)
        loop.update(target_s=LOOPBACK_TARGET_S, passed=loop["retrieval_s_median"] <= LOOPBACK_TARGET_S)
        report["loopback"] = loop
        print(f"loopback: generation done -> 3 files on disk {loop['retrieval_s_median'] * 1e3:.1f} ms "
              f"±{loop['retrieval_uncertainty_s'] * 1e3:.2f} ms median (max {loop['retrieval_s_max'] * 1e3:.1f} ms, "
              f"{loop['total_bytes']} bytes); target <= "
              f"{LOOPBACK_TARGET_S * 1e3:.0f} ms: {'PASS' if loop['passed'] else 'MISS'}; dominant phase "
              f"{loop['verdict']['title']} (cause: {loop['verdict']['cause']})")
        if args.skip_wan or os.geteuid() != 0:
            report["wan"] = {"skipped": "--skip-wan" if args.skip_wan else "needs root and iproute2"}
            print(f"wan: skipped ({report['wan']['skipped']})")
        else:
            wan = run_wan(worker, args.iterations, config, args.rate_mbit, args.rtt_ms)
            report["wan"] = wan
            print(f"wan ({args.rate_mbit:g} Mbit/s, +{args.rtt_ms:g} ms RTT): generation done -> 3 files on disk "
                  f"{wan['retrieval_s_median'] * 1e3:.1f} ms ±{wan['retrieval_uncertainty_s'] * 1e3:.2f} ms median "
                  f"(max {wan['retrieval_s_max'] * 1e3:.1f} ms); floor {wan['floor_s'] * 1e3:.1f} ms; ratio "
                  f"{wan['ratio_to_floor']:.2f} ±{wan['ratio_uncertainty']:.3f} (target <= "
                  f"{WAN_RATIO_TARGET}): {'PASS' if wan['passed'] else 'MISS'}; dominant phase "
                  f"{wan['verdict']['title']} (cause: {wan['verdict']['cause']})")
    if args.json:
        bench_env.write_json(args.json, report)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
