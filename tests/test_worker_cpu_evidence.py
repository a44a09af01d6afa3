"""The worker's own CPU evidence (breeze_worker.threadcpu) against the kernel's: a process held by a cgroup CPU
quota, in a child so that only it is held, reports the waits the kernel's counters show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from netpath.cgroups import Cgroup, cpu_limit_support

from breeze_worker import threadcpu

ROOT = Path(__file__).resolve().parents[1]

# The child: joins the cgroup it is told (its parent writes it in), then burns 0.15 s of CPU on a pool thread
# inside a PoolTask and between two `held` samples, and prints what they measured.
CHILD = textwrap.dedent("""
    import json, sys, time
    from concurrent.futures import ThreadPoolExecutor
    from breeze_worker import threadcpu

    sys.stdin.readline()  # moved into the cgroup meanwhile
    def burn():  # 0.15 s of CPU: at 20% of a CPU, at least 0.6 s held by the quota, however busy the host is
        with threadcpu.PoolTask() as task:
            start = time.thread_time()
            while time.thread_time() - start < 0.15:
                pass
        return task.wait_ns, task.run_ns
    start = threadcpu.held()
    with ThreadPoolExecutor(1) as pool:
        wait, run = pool.submit(burn).result()
    print(json.dumps({"task_wait": wait, "task_run": run, "held": threadcpu.held().wait_since(start),
                      "stats": threadcpu._quota_stats()}), flush=True)
    sys.stdin.readline()  # asleep (never held) while the parent reads the cgroup's counters
""")


# The child: a job's artifact written, its job ended (`job_done`), then 0.05 s of CPU burnt on the thread that
# would hand the commit over before it does (a held scheduler thread), then the commit on a pool thread whose
# own counters see none of that: the commit's CPU wait counts the quota's hold since the job ended. It prints
# that, and the time from the job's end to the commit's on its monotonic clock.
COMMIT_CHILD = textwrap.dedent("""
    import json, sys, time
    from concurrent.futures import ThreadPoolExecutor
    from breeze_worker.artifacts.store import ArtifactStore
    from breeze_worker.config import ArtifactSettings

    store = ArtifactStore(ArtifactSettings(directory=sys.argv[1]))
    writer = store.begin("job-1", 24000, "s16le")
    writer.append(bytes(48000))
    sys.stdin.readline()  # moved into the cgroup meanwhile
    ended = time.monotonic_ns()
    writer.job_done()
    start = time.thread_time()
    while time.thread_time() - start < 0.05:
        pass
    with ThreadPoolExecutor(1) as pool:
        info = pool.submit(writer.commit).result()
    span = time.monotonic_ns() - ended
    print(json.dumps({"cpu_wait": info.commit.cpu_wait_ns, "span": span}), flush=True)
    sys.stdin.readline()
""")


@pytest.mark.skipif(os.geteuid() != 0 or not cpu_limit_support(), reason="a cgroup CPU quota needs root and the "
                    "cpu controller")
def test_a_commit_that_a_cpu_quota_held_from_its_jobs_end_reports_that_wait(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")))
    proc = subprocess.Popen([sys.executable, "-c", COMMIT_CHILD, str(tmp_path / "artifacts")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        with Cgroup("cpu") as group:
            group.limit_cpu(0.05)  # 5 ms each 100 ms: the quota binds however busy the host is
            group.add(proc.pid)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            got = json.loads(proc.stdout.readline())
            throttled = group.throttled_ns()
            proc.communicate("end\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # 0.05 s of CPU at 5 ms a period takes at least 9 more periods, each held 95 ms: over 0.85 s held, before
    # the commit began, outside its storage calls. Without the hold since the job's end the commit reported
    # the pool thread's wait only (72 ms against 1.26 s throttled, at 20%).
    assert throttled >= 0.5e9, throttled  # the fault took hold
    assert got["cpu_wait"] is not None and 0.5e9 <= got["cpu_wait"] <= min(got["span"], throttled), (got, throttled)


def test_the_counters_are_this_threads_and_never_mixed_with_another_threads():
    now = threadcpu.sample()
    assert now is not None and now.run_ns > 0  # Linux with schedstats: what the tests run on
    other = threadcpu.CpuSample(now.run_ns, now.wait_ns, now.tid + 1)
    assert now.wait_since(other) is None and now.wait_since(None) is None
    later = threadcpu.Held(threadcpu.CpuSample(now.run_ns, now.wait_ns + 5, now.tid), {"q": 300}, at_ns=1000)
    assert later.wait_since(threadcpu.Held(now, {"q": 100}, at_ns=500)) == 200  # the quota's hold was the longer
    # the kernel adds each CPU's throttled time: never more than the time that went by
    assert later.wait_since(threadcpu.Held(now, {"q": 100}, at_ns=900)) == 100
    assert later.wait_since(threadcpu.Held(now, {}, at_ns=500)) == 5  # no common cgroup: the thread's own wait


@pytest.mark.skipif(os.geteuid() != 0 or not cpu_limit_support(), reason="a cgroup CPU quota needs root and the "
                    "cpu controller")
def test_a_process_held_by_a_cpu_quota_reports_the_wait_the_kernel_counted():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")))
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        with Cgroup("cpu") as group:
            group.limit_cpu(0.2)  # 20 ms each 100 ms
            group.add(proc.pid)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            got = json.loads(proc.stdout.readline())
            throttled = group.throttled_ns()  # from joining to now: the child's window and its quiet edges
            proc.communicate("end\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert throttled >= 0.2e9, throttled  # the fault took hold
    assert any(group.path.name in path for path in got["stats"]), got["stats"]  # it found its cgroup
    assert got["held"] is not None and 0.5 * throttled <= got["held"] <= throttled + 1, (got, throttled)
    # the spinning thread's own run-queue wait: the quota's hold fell on it (a busy host may add to it)
    assert got["task_wait"] >= 0.5 * throttled and got["task_run"] >= 0.1e9, (got, throttled)
