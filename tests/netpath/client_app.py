"""Client applications with their own timing, in a child process, and their retrievals diagnosed.

    python -m netpath.client_app --target H:P --artifact-target H:P --mode poll --period 0.8 --jobs 3

Each mode is an application built on the SDK the way applications are, not the way `diagnose` fetches:

- `poll`: a thread runs the jobs; the main loop looks for finished ones on a fixed schedule (every
  `--period` s) and fetches what it finds. Before each job the job thread waits for a different point of
  the schedule (the jobs of a real queue end at any time), so each run's gap differs; where a loaded machine's
  job times still end the jobs at one point of the schedule, the last job is run again until they differ;
- `delay`: the job's thread sleeps `--delay` s after the final message, then fetches (a timer, a batch
  window);
- `cold`: every retrieval opens a fresh client (a new process or a script per download would), so its
  connection and clock exchange are set up after the final message.

Each run is diagnosed from the SDK's records (`diagnose.timeline_from_results`, with the clock exchanges
the application's clients made), and one JSON line is printed: `DiagnoseRun.to_dict()` plus "text".
`other_jobs` is another child: it keeps the worker's engine busy with long jobs (other users' work) until
its block ends.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    path = [str(ROOT / "tests")] + [str(ROOT / d) for d in ("client", "protos")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--artifact-target", required=True)
    p.add_argument("--mode", choices=("poll", "delay", "cold", "load"), required=True)
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--max-frames", type=int, default=12)
    p.add_argument("--period", type=float, default=0.8)
    p.add_argument("--delay", type=float, default=0.4)
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args()

    from breeze_client.diagnose import DiagnoseRun, format_text, timeline_from_results
    from breeze_client.sdk import BreezeClient
    from breeze_client.verdict import diagnose

    def client() -> BreezeClient:
        return BreezeClient(args.target, artifact_target=args.artifact_target, timeout_s=args.timeout)

    if args.mode == "load":
        with client() as c:
            print(json.dumps({"ready": os.getpid()}), flush=True)
            while True:
                c.synthesize("Other users' work keeps this worker's engine busy.", max_frames=args.max_frames,
                             collect_audio=False)
    with tempfile.TemporaryDirectory(prefix="breeze-app-") as out, client() as app:
        warm = app.synthesize("warm up", max_frames=4, collect_audio=False)  # imports and connections, not timed
        app.fetch(warm.artifact, Path(out) / "warm.wav")
        run_mode = _poll if args.mode == "poll" else _one_by_one
        results = run_mode(app, client, args, Path(out))
    timelines = [timeline_from_results(job.artifact.artifact_id, fetched, synthesis=job) for job, fetched in results]
    run = DiagnoseRun(diagnose(timelines), timelines, meta={"mode": args.mode, "runs": len(timelines)})
    print(json.dumps({**run.to_dict(), "text": format_text(run)}), flush=True)


def _synthesize(app, i: int, args):
    return app.synthesize(f"Job {i + 1} of an application.", seed=i, max_frames=args.max_frames,
                          collect_audio=False)


def _fetch(client, job, out: Path):
    return client.fetch(job.artifact, out / f"{job.artifact.artifact_id}.wav")


def _poll(app, _client, args, out: Path) -> list:
    finished: queue.Queue = queue.Queue()
    start = time.monotonic()

    def tick(n: int) -> float:
        return start + n * args.period

    def run_jobs() -> None:
        gaps: list[float] = []  # each kept job's wait from its end to the next poll
        attempt = 0
        while len(gaps) < args.jobs:
            # start at a different point of the poll schedule each time: attempt / jobs of a period after a poll
            n = int((time.monotonic() - start) / args.period) + 1
            time.sleep(max(0.0, tick(n) + (attempt % args.jobs) * args.period / args.jobs - time.monotonic()))
            job = _synthesize(app, len(gaps), args)
            ended = time.monotonic()
            attempt += 1
            trial = gaps + [tick(int((ended - start) / args.period) + 1) - ended]
            # a job's time varies with the machine's load, so jobs started apart can still end at one point of
            # the schedule; the last job is kept only where the waits differ by a third of a period (as a real
            # queue's jobs, ending at any time, do), else another job runs in its place (its artifact unfetched)
            if (len(trial) == args.jobs > 1 and max(trial) - min(trial) < args.period / 3
                    and attempt < 8 * args.jobs):
                continue
            gaps.append(trial[-1])
            finished.put(job)

    worker = threading.Thread(target=run_jobs, daemon=True)
    worker.start()
    results, n = [], 0
    while len(results) < args.jobs:
        n += 1
        time.sleep(max(0.0, tick(n) - time.monotonic()))
        while not finished.empty():
            job = finished.get()
            results.append((job, _fetch(app, job, out)))
    return results


def _one_by_one(app, client, args, out: Path) -> list:
    """Each job, then its fetch: after a fixed delay (`delay`), or from a fresh client (`cold`) as a script started
    for each download would."""
    results = []
    for i in range(args.jobs):
        job = _synthesize(app, i, args)
        if args.mode == "delay":
            time.sleep(args.delay)
            results.append((job, _fetch(app, job, out)))
        else:
            with client() as fresh:
                results.append((job, _fetch(fresh, job, out)))
    return results


def run_app(*args: str, timeout_s: float = 600.0) -> dict:
    """Run an application to the end; its diagnosis as a dict."""
    result = subprocess.run([sys.executable, "-m", "netpath.client_app", *args], capture_output=True, text=True,
                            timeout=timeout_s, env=_env())
    if result.returncode != 0:
        raise RuntimeError(f"the client application failed ({result.returncode}): {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


@contextmanager
def other_jobs(target: str, artifact_target: str, max_frames: int = 400):
    """Other users' long jobs on the worker, from a child process, for the length of the block."""
    proc = subprocess.Popen([sys.executable, "-m", "netpath.client_app", "--target", target, "--artifact-target",
                             artifact_target, "--mode", "load", "--max-frames", str(max_frames)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env())
    try:
        if not proc.stdout.readline():
            raise RuntimeError(f"the load process exited ({proc.wait()}) before it was ready")
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
